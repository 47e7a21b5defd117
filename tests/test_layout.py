"""The shape of the tree: one concern per folder, data flowing one way.

These are the layout's measurable rules: no import circle between the project's
modules, the ServerApp never imports the ClientApp, ``history/`` and ``task/``
never import an app, ``coding/`` knows nothing of Flower or torch, the
ServerApp's wings import only the wings below them (:data:`WING_IMPORTS`), no
function over 60 lines of code, and the README's layout table names exactly the
top-level folders that hold code.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("server_app", "client_app", "task", "history", "strategies", "coding",
            "audits", "runstore", "experiments", "cli")
MAX_FUNCTION_LINES = 60
# The ServerApp's wings (sub-packages of server_app/) and the wings each may import:
# config < rounds < evaluation < unlearning < admission < run < stages; the modules at
# the top of server_app/ (app, preflight, ...) may import every wing, no wing them.
WING_IMPORTS = {
    "config": set(),
    "rounds": {"config"},
    "evaluation": {"config", "rounds"},
    "unlearning": {"config", "rounds", "evaluation"},
    "admission": {"config", "rounds", "evaluation", "unlearning"},
    # the run's plan and context are made of the wings below (issue 53, step 3)
    "run": {"config", "rounds", "evaluation", "unlearning", "admission"},
    "stages": {"config", "rounds", "evaluation", "unlearning", "admission", "run"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: Path) -> set[str]:
    """Project modules imported anywhere in ``path`` (also inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _imports(path) if m in modules and m != name}
            for name, path in modules.items()}


def _top(module: str) -> str:
    return module.split(".")[0]


def test_no_import_circle_between_modules():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_no_import_circle_between_folders():
    graph = _graph()
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folders.setdefault(_top(module), set()).update(
            _top(t) for t in targets if _top(t) != _top(module))
    for folder, targets in folders.items():
        for other in targets:
            assert folder not in folders.get(other, set()), (folder, other)


def test_dependencies_flow_one_way():
    forbidden = {
        "server_app": {"client_app"},
        "client_app": {"server_app"},
        "task": {"server_app", "client_app", "history", "strategies", "experiments"},
        "history": {"server_app", "client_app", "experiments"},
        "strategies": {"server_app", "client_app", "task", "experiments"},
        "coding": set(PACKAGES) - {"coding"},
        "cli": {"experiments"},  # the experiments drive the app through cli, not back
        # observers of a run: the ServerApp feeds them (audits.run.AuditedRun)
        "audits": {"server_app", "client_app", "strategies", "cli", "experiments"},
        # below both apps: the CLI and the ServerApp share it
        "runstore": {"server_app", "client_app", "audits", "cli", "experiments"},
    }
    bad = sorted((m, t) for m, targets in _graph().items() for t in targets
                 if _top(t) in forbidden.get(_top(m), set()))
    assert bad == []


def test_cli_starts_no_experiments_module():
    """Issue 53: ``cli`` and ``experiments`` depend one way; a module started by its
    name (``python -m experiments.run``) is a dependency the import graph misses."""
    bad = sorted((name, node.value) for name, path in _modules().items()
                 if _top(name) == "cli" for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and node.value.split(".")[0] == "experiments" and "." in node.value
                 and " " not in node.value)
    assert bad == []


CLI_SERVER_IMPORTS = {  # issue 53: what of the ServerApp's wings the CLI still reads
    "server_app.rounds.engine",  # the engine names a run records
    "server_app.rounds.loop",  # WALL_PARTS, the summary printer's columns
}
CLI_WINGS = {"config", "admission"}
"""The wings the CLI reads freely: the run config and the rules that refuse a
request, which ``forget`` applies before it records one, as the ServerApp does."""


def test_the_cli_reads_the_server_apps_wings_only_where_listed():
    """Issue 53 (a ratchet): the CLI imports the run config, the preflight checks and
    the run store; of the ServerApp's wings other than :data:`CLI_WINGS` only
    :data:`CLI_SERVER_IMPORTS`, each leaving this list when it moves below both apps.
    A new one fails here; the CLI imports no module of the ServerApp's stages."""
    wings = set(WING_IMPORTS) - CLI_WINGS
    found = {t for m, targets in _graph().items() if _top(m) == "cli" for t in targets
             if _wing(t) in wings}
    assert found <= CLI_SERVER_IMPORTS, sorted(found - CLI_SERVER_IMPORTS)
    assert not {t for t in found if _wing(t) == "stages"}


def test_coding_knows_nothing_of_flower_or_torch():
    bad = sorted((name, imported) for name, path in _modules().items()
                 if _top(name) == "coding" for imported in _imports(path)
                 if imported.split(".")[0] in ("flwr", "torch"))
    assert bad == []


def _wing(module: str) -> str | None:
    """The wing of a ``server_app`` module (None: a module at the top, or elsewhere)."""
    parts = module.split(".")
    if parts[0] != "server_app" or len(parts) < 2:
        return None
    return parts[1] if (ROOT / "server_app" / parts[1]).is_dir() else None


def test_every_server_app_folder_is_a_known_wing():
    folders = {p.name for p in (ROOT / "server_app").iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(WING_IMPORTS)


def test_wings_import_only_the_wings_below_them():
    bad = []
    for module, targets in _graph().items():
        wing = _wing(module)
        if wing is None:
            continue
        for target in targets:
            if _top(target) != "server_app" or _wing(target) == wing:
                continue
            other = _wing(target)
            if other is None or other not in WING_IMPORTS[wing]:
                bad.append((module, target))
    assert sorted(bad) == []


def _code_lines(source: list[str], node: ast.AST) -> int:
    body = node.body
    first = body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(
        getattr(first, "value", None), ast.Constant) and isinstance(first.value.value, str)
    start = first.end_lineno if docstring else first.lineno - 1
    lines = source[start:node.end_lineno]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def test_no_function_over_the_limit():
    long = {}
    for path in _modules().values():
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = _code_lines(source.splitlines(), node)
                if n > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = n
    assert long == {}


def test_readme_layout_table_matches_the_tree():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Layout", 1)[1]
    named = set(re.findall(r"^\| `([\w.-]+)/` \|", section, flags=re.M))
    assert named == _tracked_top_folders()


def _tracked_top_folders() -> set[str]:
    """Top-level folders holding files git tracks (what a user added is not the tree's).

    Outside a git checkout (an unpacked FAB or archive): every folder not hidden,
    not a build or results folder.
    """
    try:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                               check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        return {p.name for p in ROOT.iterdir() if p.is_dir()
                and not p.name.startswith(".") and p.name not in (
                    "results", "build", "dist", "__pycache__")
                and not p.name.endswith(".egg-info")}
    return {f.split("/", 1)[0] for f in files if "/" in f and not f.startswith(".")}


# Where a method's name may be spelled: its description, the built-ins' builders, the
# experiment definitions (run configs, as presets/ are), and the storage block's key
# (history/ imports no app; the key is a summary.json contract).
METHOD_NAME_HOMES = ("server_app/config/methods.py", "server_app/unlearning/builtin/",
                     "experiments/suites.py", "history/storage.py")
MAX_POSITIONAL = 8


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                      | ast.AsyncFunctionDef) and node.body \
                and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            out.add(id(node.body[0].value))
    return out


def method_names_outside_their_description(names: set[str], root: Path = ROOT,
                                           paths: list[Path] | None = None) -> list[str]:
    """``path:line: 'NAME'`` of each string literal equal to a method's name.

    Docstrings are prose and not counted; :data:`METHOD_NAME_HOMES` may spell them.
    """
    return _literals_outside(names, root, paths if paths is not None
                             else list(_modules().values()), METHOD_NAME_HOMES)


def _literals_outside(names: set[str], root: Path, paths: list[Path],
                      homes: tuple[str, ...]) -> list[str]:
    """``path:line: 'NAME'`` of each literal in ``names``; docstrings, ``homes`` aside."""
    found = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        if rel.startswith(homes):
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        found += [f"{rel}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in names
                  and id(node) not in docs]
    return sorted(found)


def test_no_module_lists_or_branches_on_a_method_name():
    """Item 1 of issue 41: a method's facts live in its description alone."""
    from server_app.config import methods

    assert method_names_outside_their_description(set(methods.names())) == []


def test_the_method_name_rule_finds_a_name_spelled_elsewhere(tmp_path):
    """The rule above can fail: 'SE' outside the homes is found, in a home it is not."""
    stray = tmp_path / "strategies" / "probe.py"
    home = tmp_path / "server_app" / "config" / "methods.py"
    for path in (stray, home):
        path.parent.mkdir(parents=True)
        path.write_text('"""Says SE in prose."""\n\nNAME = "SE"\n')
    assert method_names_outside_their_description({"SE"}, tmp_path, [stray, home]) == [
        "strategies/probe.py:3: 'SE'"]


def test_no_method_setting_is_named_outside_its_method():
    """Issue 53: a method's own run-config keys (``method.<key>.<field>``, and the
    flat keys they replaced) are spelled only in its module; others read them off
    its ``Settings``."""
    from server_app.config import methods

    keys = {k for m in methods.builtins() for k in m.Settings.keys()}
    keys |= set(methods.renamed_keys())
    assert keys, "the built-ins declare settings of their own"
    assert _literals_outside(keys, ROOT, list(_modules().values()),
                             ("server_app/unlearning/builtin/",)) == []


def test_no_public_callable_takes_more_than_8_positional_parameters():
    """Item 4 of issue 41: long settings travel as keyword-only arguments or objects."""
    long = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name.startswith("_") and node.name != "__init__":
                continue
            positional = [a.arg for a in node.args.posonlyargs + node.args.args
                          if a.arg not in ("self", "cls")]
            if len(positional) > MAX_POSITIONAL:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                            f"({len(positional)})")
    assert sorted(long) == []


MAX_PARAMETERS = 8


def long_signatures(paths: list[Path] | None = None, root: Path = ROOT) -> list[str]:
    """``path:line name (n)`` of each public function or ``__init__`` of > 8 parameters.

    Positional, positional-only and keyword-only parameters count; ``self``,
    ``cls``, ``*args`` and ``**kwargs`` do not.
    """
    long = []
    for path in _modules().values() if paths is None else paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if node.name.startswith("_") and node.name != "__init__":
                continue
            args = node.args
            names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs
                     if a.arg not in ("self", "cls")]
            if len(names) > MAX_PARAMETERS:
                long.append(f"{path.relative_to(root)}:{node.lineno} {node.name} "
                            f"({len(names)})")
    return sorted(long)


def test_no_public_callable_takes_more_than_8_parameters():
    """Item 6 of issue 53: related settings travel as one object (a schedule, a plan)."""
    assert long_signatures() == []


def test_the_parameter_rule_finds_a_long_signature(tmp_path):
    """The rule above can fail: 9 keyword-only parameters, or an ``__init__`` of 9."""
    probe = tmp_path / "strategies" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("def run(a, b, *, c, d, e, f, g, h, i):\n    pass\n\n\n"
                     "def _hidden(a, b, c, d, e, f, g, h, i):\n    pass\n\n\n"
                     "def fits(self, a, b, c, d, e, f, g, h, *args, **kwargs):\n"
                     "    pass\n\n\n"
                     "class Probe:\n"
                     "    def __init__(self, a, b, c, /, d, e, f, g, h, i):\n"
                     "        pass\n")
    assert long_signatures([probe], tmp_path) == [
        "strategies/probe.py:1 run (9)", "strategies/probe.py:14 __init__ (9)"]


# Where a built-in dataset's name may be spelled: its task module and the registry
# (task/tasks/), and what the experiment suites know of it (experiments/facts.py).
# presets/, docs/ and tests/ spell them too; they are not scanned.
DATASET_NAME_HOMES = ("task/tasks/", "experiments/facts.py")
SCRIPT_FOLDERS = ("examples", "benchmarks")


def dataset_names_outside_their_task(names: set[str], root: Path = ROOT,
                                     paths: list[Path] | None = None) -> list[str]:
    """``path:line: 'NAME'`` of each string literal equal to a built-in task's name.

    Docstrings are prose and not counted; :data:`DATASET_NAME_HOMES` may spell them.
    Scans the packages' modules and the scripts of :data:`SCRIPT_FOLDERS`.
    """
    if paths is None:
        paths = [*_modules().values(), *(p for folder in SCRIPT_FOLDERS
                                         for p in sorted((root / folder).rglob("*.py")))]
    return _literals_outside(names, root, paths, DATASET_NAME_HOMES)


def test_no_module_lists_or_branches_on_a_dataset_name():
    """Item 2 of issue 41: a built-in task's facts live in its module alone."""
    from task.tasks import BUILTIN_TASKS

    assert dataset_names_outside_their_task(set(BUILTIN_TASKS)) == []


def test_the_dataset_name_rule_finds_a_name_spelled_elsewhere(tmp_path):
    """The rule above can fail: 'mnist' outside task/tasks/ is found, inside it is not."""
    stray = tmp_path / "experiments" / "probe.py"
    home = tmp_path / "task" / "tasks" / "probe.py"
    for path in (stray, home):
        path.parent.mkdir(parents=True)
        path.write_text('"""Says mnist in prose."""\n\nif NAME == "mnist":\n    pass\n')
    assert dataset_names_outside_their_task({"mnist"}, tmp_path, [stray, home]) == [
        "experiments/probe.py:3: 'mnist'"]


# Item 5 of issue 41: the modules that patch Flower 1.42 belong to the deployment
# layer (cli/) and run only in the processes our own commands start. The apps reach
# them only through the one sanctioned hook, server_app.app.deployment_grid, which
# imports what the environment variable APP_HOOK_ENV names (set by cli/ alone).
FLOWER_PATCH_MODULES = ("cli.polling_grid", "cli.supernode", "cli.warm_exec")
APPS = ("server_app", "client_app")
APP_HOOK_ENV = "SE_DEPLOY_GRID_HOOK"
APP_HOOK_HOME = "server_app/app.py"


def flower_patches_in_apps(root: Path = ROOT, paths: list[Path] | None = None
                           ) -> list[str]:
    """``path:line: what`` for each way an app module could reach a Flower patch.

    An import of any ``cli`` module, a string naming a patch module (an
    ``importlib`` call), and the hook's variable outside :data:`APP_HOOK_HOME`.
    """
    if paths is None:
        paths = [p for name, p in _modules().items() if _top(name) in APPS]
    found = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [f"{rel}:{node.lineno}: imports {n}" for n in names
                      if _top(n) == "cli"]
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith(FLOWER_PATCH_MODULES):
                    found.append(f"{rel}:{node.lineno}: names {node.value}")
                elif APP_HOOK_ENV in node.value and rel != APP_HOOK_HOME:
                    found.append(f"{rel}:{node.lineno}: reads {APP_HOOK_ENV}")
    return sorted(found)


def test_the_flower_patches_live_in_the_deployment_layer():
    modules = _modules()
    assert all(name in modules and _top(name) == "cli" for name in FLOWER_PATCH_MODULES)


def test_no_app_module_imports_a_flower_patch():
    """Item 5 of issue 41: the ServerApp and the ClientApp run on stock Flower."""
    assert flower_patches_in_apps() == []


def test_the_flower_patch_rule_finds_an_app_reaching_a_patch(tmp_path):
    """The rule above can fail: an import, a named patch module, a stray hook."""
    stray = tmp_path / "client_app" / "probe.py"
    home = tmp_path / "server_app" / "app.py"
    stray.parent.mkdir(parents=True)
    home.parent.mkdir(parents=True)
    stray.write_text(f'from cli.supernode import main\n\nSPEC = "cli.polling_grid:x"\n'
                     f'HOOK = "{APP_HOOK_ENV}"\n')
    home.write_text(f'HOOK = "{APP_HOOK_ENV}"\n')
    assert flower_patches_in_apps(tmp_path, [stray, home]) == [
        "client_app/probe.py:1: imports cli.supernode",
        "client_app/probe.py:3: names cli.polling_grid:x",
        f"client_app/probe.py:4: reads {APP_HOOK_ENV}"]

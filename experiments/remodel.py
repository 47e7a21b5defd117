"""The paper-scale cells' times remade under the cost model (issue 52, item 2).

Usage: ``.venv/bin/python -m experiments.remodel [--folder FOLDER] [--stamp] [NAME ...]``

Each ``explore-*-s*.json`` of ``FOLDER`` (default ``docs/results/paper-scale/``;
also ``docs/results/wall/`` and its ``shipped/``), or the NAMEs given, holds one
real run of a cell: its accuracies, and modelled wall times
made before the cost model from seconds measured on a shared machine. One
cost-only run of the file's config and frameworks (:mod:`experiments.costing`:
the real ServerApp and strategies, clients that report what training would
but do not train; the file's schedule variants registered as the file did)
prices the same schedule by the run's device profile, so the times no longer
move with the machine's load. Written to ``modelled/<NAME>`` beside it: the
commit, the code :func:`~experiments.time_saved.fingerprint`, the command and,
per framework, its modelled seconds, their breakdown, its client-epochs, and
``same_schedule``: whether those client-epochs and rounds equal the file's (the
schedule its training ran). :func:`experiments.pareto.load` reads the times
from there, the accuracies from the file.

A file whose run was made by the cost-model code holds its own ``fingerprint``
(``explore.record`` writes it; ``--stamp`` adds it to one made before that) and
needs no remaking while that code is today's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from cli.terminal import Parser
from experiments.pareto import MODELLED, PAPER_SCALE
from experiments.time_saved import fingerprint, fingerprint_at

ROOT = Path(__file__).resolve().parents[1]
KEPT = ("modelled_wall_s", "wall_breakdown", "client_epochs", "client_rounds",
        "rounds_replayed")
"""What a remade framework entry keeps of the cost-only summary."""


def remodel(source: Path) -> dict:
    """One cost-only run of ``source``'s cell; the remade file's content.

    Raises
    ------
    server_app.config.ConfigError, RuntimeError
        As :func:`experiments.costing.cost_only_summary` (the file's config no
        longer runs).
    """
    from experiments.costing import cost_only_summary
    from server_app.config.methods import in_current_keys

    real = json.loads(source.read_text())
    _register(real.get("variants", {}))
    cfg = {k: v for k, v in in_current_keys(real["config"]).items()
           if k not in ("run-name", "results-dir")}
    # 100 test samples: the server's evaluation is not priced, only slow
    cfg.update({"data-dir": str(ROOT.parent / "shared" / "data"), "test-samples": 100})
    with tempfile.TemporaryDirectory(prefix="se-remodel.") as folder:
        summary = cost_only_summary(cfg, Path(folder))
    frameworks = {}
    for name, fw in summary["frameworks"].items():
        entry = {k: fw.get(k) for k in KEPT}
        was = real["frameworks"].get(name, {})
        entry["same_schedule"] = (was.get("client_epochs") == fw.get("client_epochs")
                                  and was.get("client_rounds") == fw.get("client_rounds"))
        frameworks[name] = entry
    return {"source": source.name, "source_commit": real["commit"], "commit": _head(),
            "fingerprint": fingerprint(),
            "command": (".venv/bin/python -m experiments.remodel --folder "
                        f"{source.parent.relative_to(ROOT)} {source.name}"),
            "cost_model": summary.get("cost_model"), "frameworks": frameworks}


def _register(variants: dict) -> None:
    """Register ``docs/results/wall/explore.py``'s schedule variants a file ran."""
    from server_app.config import methods

    wall = ROOT / "docs" / "results" / "wall"
    for folder in (wall, ROOT / "docs" / "results" / "recovery"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    from explore import variant

    for name in variants:
        if methods.registered(name) is None:
            methods.register(name, variant(name))


def _head() -> str:
    """The checkout's commit."""
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True, check=False).stdout.strip()


def main(names: list[str], folder: Path = PAPER_SCALE) -> list[Path]:
    """Remake ``names`` (default: every ``explore-*-s*.json`` of ``folder``)."""
    sources = [folder / n for n in names] or sorted(folder.glob("explore-*-s*.json"))
    out = folder / MODELLED
    out.mkdir(exist_ok=True)
    written = []
    for source in sources:
        path = out / source.name
        path.write_text(json.dumps(remodel(source), indent=1) + "\n")
        print(path, flush=True)
        written.append(path)
    return written


def stamp(paths: list[Path]) -> list[Path]:
    """Record in each file the :func:`~experiments.time_saved.fingerprint_at` its commit.

    For a real run made by the cost-model code before :func:`explore.record`
    wrote the fingerprint itself: its own modelled seconds are then the cost
    model's (:func:`experiments.pareto.remade` reads them, no cost-only run
    needed, and a method that picks its schedule from the updates' values keeps
    its time). A file made before the cost model gets the fingerprint of that
    older code, which the claims tests refuse. Files that hold one are left as
    they are.
    """
    written = []
    for path in paths:
        data = json.loads(path.read_text())
        if "fingerprint" not in data:
            data["fingerprint"] = fingerprint_at(data["commit"], ROOT)
            path.write_text(json.dumps(data, indent=1) + "\n")
            written.append(path)
    return written


if __name__ == "__main__":

    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="file names in FOLDER (default: all)")
    parser.add_argument("--folder", type=Path, default=PAPER_SCALE)
    parser.add_argument("--stamp", action="store_true",
                        help="only record each file's code fingerprint (stamp())")
    args = parser.parse_args()
    folder = args.folder.resolve()
    if args.stamp:
        for path in stamp([folder / n for n in args.names]
                          or sorted(folder.glob("explore-*-s*.json"))):
            print(path)
    else:
        main(args.names, folder)

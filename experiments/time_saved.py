"""SE's modelled time saved for every client of a paper-scale federation (issue 52).

Usage: ``.venv/bin/python -m experiments.time_saved DATASET [--reference N]``

For each client c of the paper suite's non-IID single-request cell of ``DATASET``
(presets/paper.toml: C = 100, S = 4, 20 clients a round, L = 10, G = 30, seed 0;
SE as it ships), one cost-only run (:mod:`experiments.costing`: the real
ServerApp and strategies, clients that report what training would but do not
train) forgets c with SE and gives SE's modelled seconds; every such run starts
from a copy of one cost-only learning (:func:`learn_once`), as a run of its own
would have learned it. FR and SISA, whose
time hardly depends on which client asks, run for ``N`` clients drawn by
``random.Random(52)`` before any run (default 3); SE's saving for client c is
``1 - SE(c) / mean FR``. Modelled seconds use the run's device profile
(``cpu-core``), so they are the same on any machine under any load.

Writes ``docs/results/time-saved/<DATASET>.json`` after every client (a killed
sweep resumes where it stopped; the clients go in an order drawn by
``random.Random(52)``, so a sweep cut short is a seeded random sample of them, its
size ``clients_swept``): per client its SE seconds and rounds replayed,
the reference runs, and the mean, sample SD (n - 1), min and max of the saving.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from cli.terminal import Parser
from experiments.doc_tables import paper_claim
from experiments.suites import paper_cell
from server_app.config import methods

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "time-saved"


SE = methods.proposed()


def cell_config(dataset: str) -> dict:
    """The paper suite's non-IID single-request config of ``dataset``, SE as shipped.

    :func:`experiments.suites.paper_cell`, evaluated on 100 test samples (the
    server's evaluation is not priced).
    """
    return {**paper_cell(dataset), "test-samples": 100,
            "data-dir": str(ROOT.parent / "shared" / "data")}


def modelled(cfg: dict, client: int, frameworks: str, learned: Path) -> dict:
    """Cost-only run forgetting ``client``, from the learning ``learned``: :func:`costs`.

    ``learned``: the cost-only learning of ``cfg`` (:func:`learn_once`); the run
    starts from a copy of it (:func:`experiments.learned.copy_learned`: the
    history and models its own learning would give, seeded), made beside it (the
    copy keeps its ``results-dir``) and removed after.
    """
    from experiments.costing import cost_only_summary
    from experiments.learned import copy_learned

    run = {**cfg, "frameworks": frameworks, "forget-clients": str(client),
           "run-name": f"cost-only-c{client}", "mia": False}
    target = copy_learned(learned, {**run, "results-dir": str(learned.parent)})
    try:
        return costs(cost_only_summary(run, learned.parent))
    finally:
        shutil.rmtree(target)


def costs(summary: dict) -> dict:
    """What a sweep keeps of a run's ``summary``, per framework.

    ``{name: {"modelled_wall_s": seconds, "client_epochs", "rounds_replayed"}}``.
    """
    return {name: {"modelled_wall_s": fw["modelled_wall_s"],
                   "client_epochs": fw["client_epochs"],
                   "rounds_replayed": fw.get("rounds_replayed")}
            for name, fw in summary["frameworks"].items()}


def learn_once(cfg: dict, folder: Path) -> Path:
    """The cost-only learning of ``cfg`` in ``folder``, which every client's run copies.

    Learning does not depend on who asks (:mod:`experiments.learned`), and was
    about 60% of a client's cost-only run (MNIST, 9 of 14 s).
    """
    from experiments.costing import cost_only_summary
    from experiments.learned import learning_config

    cost_only_summary({**learning_config(cfg), "run-name": "learned"}, folder)
    return folder / "learned"


SHAPING = ("server_app/rounds", "server_app/config/profile.py",
           "server_app/config/device_profiles", "server_app/unlearning", "strategies",
           "experiments/costing.py", "task/train.py")
"""The code that shapes a sweep's numbers (the cost model, the round loop, the
methods and their strategies, the cost-only client): its :func:`fingerprint`."""

AUDITING = ("audits", "server_app/evaluation", "server_app/stages/audit.py",
            "server_app/stages/references.py", "server_app/stages/learn.py",
            "task/local_training.py")
"""The code that shapes the audits' numbers beside :data:`SHAPING` (membership
inference, LiRA, U-LiRA and its references (learned with the run's shard strategy
and the clients' training reply), the backdoor check, what the ServerApp hands
them): with it,
:func:`audit_fingerprint`, which a run that reports an audit records too."""


def fingerprint(root: Path = ROOT, code: tuple[str, ...] = SHAPING) -> str:
    """SHA-256 over ``code`` (default :data:`SHAPING`): each file's path and its code.

    A Python file counts as its syntax tree without docstrings (``ast.dump``), so
    a comment, a docstring or a line break changes nothing, and any other edit
    does; a device profile (TOML) counts as its values. Files sorted by path.
    """
    import hashlib

    digest = hashlib.sha256()
    for entry in code:
        base = root / entry
        files = sorted(base.rglob("*")) if base.is_dir() else [base]
        for path in files:
            if path.is_file() and path.suffix in (".py", ".toml"):
                digest.update(str(path.relative_to(root)).encode() + b"\0")
                digest.update(code_of(path).encode())
    return digest.hexdigest()


def code_of(path: Path) -> str:
    """What of ``path`` can shape a number, as text.

    A Python file's syntax tree less docstrings; a TOML file's values (sorted JSON).

    Raises
    ------
    SyntaxError, tomllib.TOMLDecodeError
        The file does not parse.
    """
    import ast
    import tomllib

    text = path.read_text()
    if path.suffix == ".toml":
        return json.dumps(tomllib.loads(text), sort_keys=True)
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def audit_fingerprint(root: Path = ROOT) -> str:
    """:func:`fingerprint` of :data:`SHAPING` and :data:`AUDITING` together."""
    return fingerprint(root, SHAPING + AUDITING)


def fingerprint_at(commit: str, root: Path = ROOT, code: tuple[str, ...] = SHAPING) -> str:
    """:func:`fingerprint` of the ``code`` at ``commit`` (``git archive``).

    Raises
    ------
    subprocess.CalledProcessError
        ``commit`` is not in the checkout's history, or a path of ``code`` is
        not in it.
    """
    import tarfile

    with tempfile.TemporaryDirectory(prefix="se-fingerprint.") as folder:
        tar = subprocess.run(["git", "archive", commit, *code], cwd=root, check=True,
                             capture_output=True).stdout
        tar_path = Path(folder) / "shaping.tar"
        tar_path.write_bytes(tar)
        with tarfile.open(tar_path) as archive:
            archive.extractall(folder, filter="data")
        return fingerprint(Path(folder), code)


def spread(values: list[float]) -> dict:
    """Mean, sample SD (n - 1), min, max and n of ``values``."""
    return {"mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values), "n": len(values)}


def main(dataset: str, references: int = 3) -> Path:
    """Sweep every client of ``dataset``'s cell; returns the file written."""
    cfg = cell_config(dataset)
    clients = int(cfg["num-clients"])
    path = OUT / f"{dataset}.json"
    done = json.loads(path.read_text()) if path.is_file() else {}
    if done.get("fingerprint") != fingerprint():  # made by other code: start over
        done = {}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                            capture_output=True).stdout.strip()
    result = {"dataset": dataset, "commit": done.get("commit", commit),
              "fingerprint": fingerprint(),
              "command": f".venv/bin/python -m experiments.time_saved {dataset}",
              "config": {k: v for k, v in cfg.items() if k != "data-dir"},
              "paper_reduction_pct": 100.0 * (paper_claim(dataset) or 0.0),
              "reference_clients": sorted(random.Random(52).sample(range(clients),
                                                                   references)),
              "reference": done.get("reference", {}), "se": done.get("se", {})}
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="se-learned.") as scratch:
        learned = learn_once(cfg, Path(scratch))
        for c in result["reference_clients"]:
            if str(c) not in result["reference"]:
                result["reference"][str(c)] = modelled(
                    cfg, c, f"{methods.reference()},{methods.shard_reference()}", learned)
                path.write_text(json.dumps(result, indent=1) + "\n")
        # a seeded order, fixed before any run: a sweep cut short is a random sample
        for c in random.Random(52).sample(range(clients), clients):
            if str(c) not in result["se"]:
                result["se"][str(c)] = modelled(cfg, c, SE, learned)[SE]
                result["summary"] = summarize(result)
                path.write_text(json.dumps(result, indent=1) + "\n")
                seconds = result["se"][str(c)]["modelled_wall_s"]
                print(f"{dataset} client {c}: SE {seconds:.2f} s", flush=True)
    result["summary"] = summarize(result)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def summarize(result: dict) -> dict:
    """FR and SISA seconds over the reference clients; SE's saving over all clients."""
    fr = [r[methods.reference()]["modelled_wall_s"] for r in result["reference"].values()]
    sisa = [r[methods.shard_reference()]["modelled_wall_s"]
            for r in result["reference"].values()]
    fr_mean = statistics.fmean(fr)
    saved = [100.0 * (1.0 - r["modelled_wall_s"] / fr_mean)
             for r in result["se"].values()]
    return {"fr_s": spread(fr), "sisa_s": spread(sisa),
            "se_s": spread([r["modelled_wall_s"] for r in result["se"].values()]),
            "se_saved_pct": spread(saved),
            "sisa_saved_pct": 100.0 * (1.0 - statistics.fmean(sisa) / fr_mean),
            "clients_swept": len(saved)}


def table(folder: Path = OUT) -> str:
    """The markdown table of every ``<dataset>.json`` in ``folder`` (docs/RESULTS.md).

    ``.venv/bin/python -m experiments.time_saved --table``.
    """
    rows = ["| dataset (non-IID) | clients swept | SE: time saved, mean ± SD [min, max] "
            "| SISA: time saved | FR, modelled s (n) | SE, modelled s | paper | commit |",
            "|---|---|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        r = json.loads(path.read_text())
        s = r.get("summary")
        if not s:
            continue
        saved, fr, se = s["se_saved_pct"], s["fr_s"], s["se_s"]
        sd = f" ± {saved['sd']:.1f}" if saved["sd"] is not None else ""
        rows.append(
            f"| {r['dataset']} | {s['clients_swept']} of {r['config']['num-clients']} "
            f"| {saved['mean']:.1f}%{sd} [{saved['min']:.1f}, {saved['max']:.1f}] "
            f"| {s['sisa_saved_pct']:.1f}% | {fr['mean']:.2f} ({fr['n']}) "
            f"| {se['mean']:.2f} | {r['paper_reduction_pct']:.2f}% | {r['commit'][:7]} |")
    return "\n".join(rows)


def shortfall(folder: Path = OUT) -> str:
    """Per swept dataset: SE's mean saving, its SD, the clients and the gap to the paper.

    The line RESULTS' goals print (``tests/test_docs_claims.py`` checks it).
    """
    parts = []
    for path in sorted(folder.glob("*.json")):
        r = json.loads(path.read_text())
        if not r.get("summary"):
            continue
        saved, paper = r["summary"]["se_saved_pct"], r["paper_reduction_pct"]
        gap = paper - saved["mean"]
        parts.append(f"{r['dataset']} {saved['mean']:.1f}% (SD {saved['sd']:.1f}, "
                     f"{saved['n']} of {r['config']['num-clients']} clients) against "
                     f"{paper:.2f}%, {abs(gap):.1f} points "
                     + ("short" if gap > 0 else "over"))
    return "; ".join(parts)


if __name__ == "__main__":
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", nargs="?")
    parser.add_argument("--reference", type=int, default=3)
    parser.add_argument("--table", action="store_true",
                        help="print the table of the files written so far")
    parser.add_argument("--fingerprint", action="store_true",
                        help="print today's code fingerprint (a results folder records it)")
    parser.add_argument("--audit-fingerprint", action="store_true",
                        help="print today's fingerprint of that code and the audits'")
    args = parser.parse_args()
    if args.fingerprint:
        sys.exit(print(fingerprint()))
    if args.audit_fingerprint:
        sys.exit(print(audit_fingerprint()))
    if args.table or not args.dataset:
        sys.exit(print(table()))
    sys.exit(print(main(args.dataset, args.reference)))

"""The paper's scale on every dataset: one single-request cell (issue 44, item 2).

Usage: ``.venv/bin/python docs/results/paper-scale/run.py DATASET [SEED [PARTITION]]``
runs the ``paper`` suite's single-request cell of ``DATASET``
(:func:`experiments.suites.single_runs`: presets/paper.toml's C = 100, S = 4, 20
clients a round, L = 10, G = 30; the task's preset training keys; one request of
one client) with the partition ``PARTITION`` (``noniid``, default, or ``iid``) and
the shipped defaults: the preset's
paper-SE schedule keys are dropped, so SE and SE-R run as they ship, and the
paper's SE runs beside them as ``SE-paper`` (``docs/results/wall/explore.py``'s
variant: no exact final round, no refilled slot). Frameworks: FR, SISA, SE,
SE-paper, SE-R, all forgetting from the same learned shards, in one process
(:func:`experiments.grid.run_in_process`). FE, RR and FRec are left out: each needs
an unsharded federation learned beside the shards, which doubles a cell's time
(the MNIST cells of ``docs/results/paper-preset/`` have them).

``--baselines`` runs instead the same cell (the same request) with FR, FE, RR,
FRec and SE (FE, RR and FRec on an unsharded federation learned beside the
shards), into ``baselines/explore-paper-<DATASET>-<PARTITION>-s<SEED>.json``.
``--baselines --only FE,RR`` runs only those of them, a piece of the cell small
enough for one session on one core (CIFAR-10's whole cell is about 4 hours), into
``baselines/parts/explore-paper-<DATASET>-<PARTITION>-<NAMES>-s<SEED>.json``, in a run
folder of its own; ``--merge`` then joins the pieces that cover :data:`BASELINES`
into the cell's file (:func:`merge`: refused unless they share the config but for
the frameworks, the code fingerprint and the learned model).
``--clients K`` runs instead, once each, the first K clients of the order
``random.Random(52)`` draws (issue 52, item 3: accuracy over forgotten clients
drawn before any run; :mod:`experiments.time_saved` sweeps its clients in the same
order), each forgotten by SISA, SE, SE-paper and SE-R, FR beside them for the first
two; files ``clients/explore-paper-<DATASET>-<PARTITION>-c<C>-s<SEED>.json``. The
cell learns once (``RUNS/<DATASET>/learned-s<SEED>``) and each client's run starts
from a copy of that learning (:func:`from_learning`; the same models as a run of
its own, seeded); its file names the learning in ``learning_copied_from``. Files
made before this (MNIST's, Fashion-MNIST's and Tiny Shakespeare's first three)
learned once per client. ``--part I/N`` shares the clients among N processes (the
clients i with i mod N = I; part 0 learns, the others wait for its learning), e.g.
CIFAR-10 on two cores: ``run.py cifar10 0 --clients 5 --part 0/2`` and, beside it,
``--part 1/2``.

Writes ``explore-paper-<DATASET>-<PARTITION>-s<SEED>.json`` here, in the format of the
schedule files (:mod:`experiments.pareto` reads both); ``run.sh`` skips the files
that exist. The run itself lives in ``RUNS/<DATASET>/s<SEED>`` (``RUNS``: the
environment's ``PAPER_SCALE_RUNS``, default ``paper-scale-runs`` beside the
checkout; ``RUNS/<DATASET>-iid/s<SEED>`` for an IID cell): the same command after
a kill resumes it, learning after its last finished round and then the frameworks
not done yet, so a cell longer than a session (CIFAR-10 on CPU) finishes over
several.
"""

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WALL = ROOT / "docs/results/wall"
sys.path[:0] = [str(ROOT), str(WALL), str(ROOT / "docs/results/recovery")]

FRAMEWORKS = ("FR", "SISA", "SE", "SE-paper", "SE-R")
BASELINES = ("FR", "FE", "RR", "FRec", "SE")
"""``--baselines``: the unsharded methods beside FR and SE (issue 52, item 4)."""


def cell_config(dataset: str, seed: int, partition: str = "noniid") -> dict:
    """The paper suite's single-request config of ``dataset`` at the defaults.

    Raises StopIteration where the suite has no ``partition`` cell of ``dataset``
    (:func:`experiments.suites.paper_cell`).
    """
    from experiments.suites import paper_cell

    return {**paper_cell(dataset, seed, partition), "frameworks": ",".join(FRAMEWORKS),
            "data-dir": str(ROOT.parent / "shared" / "data"), "run-name": f"s{seed}"}


def main(dataset: str, seed: int = 0, partition: str = "noniid",
         drawn_index: int | None = None, baselines: bool = False,
         learns: bool = True, only: tuple[str, ...] = ()) -> Path:
    """Run the cell and write its file; its path.

    ``drawn_index`` i: forget the i-th client :func:`drawn` (from 0), FR only for
    the first two; ``baselines``: :data:`BASELINES` instead of :data:`FRAMEWORKS`,
    or ``only`` those of them (a piece, written under ``baselines/parts``).
    """
    from explore import record

    if partition not in ("noniid", "iid"):
        sys.exit(f"run.py: partition {partition!r} is not one of: noniid, iid")
    cell = f"paper-{dataset}-{partition}"
    command = f".venv/bin/python docs/results/paper-scale/run.py {dataset} {seed}"
    command += "" if partition == "noniid" else f" {partition}"
    runs = Path(os.environ.get("PAPER_SCALE_RUNS", ROOT.parent / "paper-scale-runs"))
    folder = runs / (dataset if partition == "noniid" else f"{dataset}-{partition}")
    cfg, out = cell_config(dataset, seed, partition), HERE
    if drawn_index is not None:  # one of the clients drawn before any run
        client = drawn(drawn_index + 1)[-1]
        names = [n for n in FRAMEWORKS if drawn_index < 2 or n != "FR"]
        cfg.update({"forget-clients": str(client), "frameworks": ",".join(names),
                    "mia": False,  # accuracy only: the audits train models of their own
                    "run-name": f"c{client}-s{seed}"})
        cell, out = f"{cell}-c{client}", HERE / "clients"
        command += f" --clients {drawn_index + 1}  # its last: client {client}"
        learned = from_learning(cfg, folder, seed, learns)
    elif baselines:
        cfg.update({"frameworks": ",".join(BASELINES), "run-name": f"baselines-s{seed}"})
        out, command = HERE / "baselines", command + " --baselines"
        if only:  # a piece of the cell, in a run folder of its own
            names = "-".join(only)
            cfg.update({"frameworks": ",".join(only),
                        "run-name": f"baselines-{names}-s{seed}"})
            cell, out = f"{cell}-{names}", out / "parts"
            command += f" --only {','.join(only)}"
    variants = [] if baselines else ["SE-paper", "SE-R"]
    result = record(cell, cfg, variants, command, results_dir=folder)
    if drawn_index is not None:
        result["learning_copied_from"] = learned
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"explore-{cell}-s{seed}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def from_learning(cfg: dict, folder: Path, seed: int, learns: bool = True) -> str:
    """Start the client run ``cfg`` from the cell's one learning; the learning's name.

    The learning (``learned-s<SEED>``, frameworks none) is made once, resumably,
    in ``folder`` (``learns`` False: by another process of ``--part``, whose end
    this one waits for); each drawn client's run folder is a copy of it
    (:func:`experiments.learned.copy_learned`: the models and history its own
    learning would give, seeded), made unless the folder exists (a resumed run).
    """
    import time

    from explore import register

    from experiments.grid import run_in_process
    from experiments.learned import copy_learned, learning_config

    name = f"learned-s{seed}"
    done = folder / name / "summary.json"
    if not done.is_file() and learns:
        run_in_process({**learning_config(cfg), "results-dir": str(folder),
                        "run-name": name})
    if not done.is_file():
        print(f"waiting for {done} (part 0 learns)", flush=True)
    while not done.is_file():
        time.sleep(60)
    register(cfg["frameworks"].split(","))  # the run's settings name the variants
    if not (folder / cfg["run-name"]).exists():
        copy_learned(folder / name, {**cfg, "results-dir": str(folder)})
    return name


class PieceError(ValueError):
    """The pieces of a cell cannot be joined: one line naming what differs."""


def merge(dataset: str, seed: int = 0, partition: str = "noniid",
          folder: Path = HERE / "baselines") -> Path:
    """Join the ``--only`` pieces of a baselines cell into the cell's file; its path.

    The pieces (``folder/parts/explore-paper-<DATASET>-<PARTITION>-*-s<SEED>.json``)
    must hold every framework of :data:`BASELINES` once, and share the config but
    for ``frameworks`` and ``run-name``, the code :func:`fingerprint
    <experiments.time_saved.fingerprint>`, the learned model's accuracy and loss
    (one seeded learning, made once per piece) and, where pieces recorded one, the
    unsharded federation's learned accuracy; their storage entries must agree
    where two pieces have one (an entry of ``source`` "not run" is a store the
    piece did not have). The file is the first piece's, with every piece's
    frameworks in :data:`BASELINES` order, the storage joined and ``parts``: each
    piece's file, commit, command and machine.

    Raises
    ------
    PieceError
        No piece, a framework missing or in two pieces, or pieces that differ.
    """
    cell = f"paper-{dataset}-{partition}"
    paths = sorted((folder / "parts").glob(f"explore-{cell}-*-s{seed}.json"))
    pieces = [json.loads(p.read_text()) for p in paths]
    held = [n for piece in pieces for n in piece["frameworks"]]
    if sorted(held) != sorted(BASELINES):
        raise PieceError(f"the pieces of {cell} hold {held or 'nothing'}: each of "
                         f"{','.join(BASELINES)} must be in exactly one")
    same = ("fingerprint", "learned_accuracy", "learned_loss", "metric", "seed")
    unsharded = [(p, piece["baseline_learned_accuracy"]) for p, piece
                 in zip(paths, pieces, strict=True)
                 if piece.get("baseline_learned_accuracy") is not None]
    if len({a for _, a in unsharded}) > 1:  # FE's and FRec's federation, learned twice
        raise PieceError(f"the pieces' unsharded learnings differ: {unsharded}")
    for path, piece in zip(paths[1:], pieces[1:], strict=True):
        differ = [k for k in same if piece.get(k) != pieces[0].get(k)] + sorted(
            k for k in set(piece["config"]) | set(pieces[0]["config"])
            if k not in ("frameworks", "run-name")
            and piece["config"].get(k) != pieces[0]["config"].get(k))
        if differ:
            raise PieceError(f"{path.name} differs from {paths[0].name} in {differ}")
    storage: dict = {}
    for path, piece in zip(paths, pieces, strict=True):
        for key, value in (piece.get("storage") or {}).items():
            if _empty(value):  # a store this piece did not have (FE's, without FE)
                storage.setdefault(key, value)
            elif not _empty(storage.get(key)) and storage[key] != value:
                raise PieceError(f"{path.name}'s storage {key!r} differs from another "
                                 "piece's")
            else:
                storage[key] = value
    frameworks = {n: f for piece in pieces for n, f in piece["frameworks"].items()}
    result = {**pieces[0], "cell": cell, "storage": storage,
              "command": " ; ".join(p["command"] for p in pieces),
              "config": {**pieces[0]["config"], "frameworks": ",".join(BASELINES),
                         "run-name": f"baselines-s{seed}"},
              "frameworks": {n: frameworks[n] for n in BASELINES},
              "parts": [{"file": f"parts/{path.name}", "commit": p["commit"],
                         "command": p["command"], "machine": p["machine"]}
                        for path, p in zip(paths, pieces, strict=True)]}
    out = folder / f"explore-{cell}-s{seed}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    return out


def _empty(value) -> bool:
    """A storage entry of a store the run did not have: None, or no bytes in it."""
    return value is None or (isinstance(value, dict) and value.get("source") == "not run")


def drawn(k: int, clients: int = 100) -> list[int]:
    """The first ``k`` clients of the order ``random.Random(52)`` draws."""
    import random

    return random.Random(52).sample(range(clients), clients)[:k]


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("seed", nargs="?", type=int, default=0)
    parser.add_argument("partition", nargs="?", default="noniid")
    parser.add_argument("--clients", type=int, default=0,
                        help="run the first K drawn clients, one run each (FR: first 2)")
    parser.add_argument("--baselines", action="store_true",
                        help="FR, FE, RR, FRec and SE on the cell (issue 52, item 4)")
    parser.add_argument("--only", default="", metavar="NAMES",
                        help="with --baselines: only these of FR,FE,RR,FRec,SE (a piece)")
    parser.add_argument("--merge", action="store_true",
                        help="with --baselines: join the --only pieces into its file")
    parser.add_argument("--part", default="0/1", metavar="I/N",
                        help="with --clients: the drawn clients i with i mod N = I, so N "
                             "processes share them (part 0 learns, the others wait)")
    args = parser.parse_args()
    part, _, parts = args.part.partition("/")
    if not (part.isdigit() and parts.isdigit() and int(part) < int(parts)):
        parser.error(f"--part {args.part!r} must be I/N with 0 <= I < N, e.g. 1/2")
    part, parts = int(part), int(parts)
    only = tuple(n for n in args.only.split(",") if n)
    if only and (not args.baselines or args.clients or not set(only) <= set(BASELINES)):
        parser.error(f"--only {args.only!r} needs --baselines (no --clients) and names "
                     f"among {','.join(BASELINES)}")
    if args.merge:
        if not args.baselines or only or args.clients:
            parser.error("--merge goes with --baselines alone (no --only, no --clients)")
        try:
            print(merge(args.dataset, args.seed, args.partition))
        except PieceError as err:
            sys.exit(f"run.py: {err}")
    elif not args.clients:
        print(main(args.dataset, args.seed, args.partition, baselines=args.baselines,
                   only=only))
    for i, c in enumerate(drawn(args.clients)):
        name = f"explore-paper-{args.dataset}-{args.partition}-c{c}-s{args.seed}.json"
        if i % parts == part and not (HERE / "clients" / name).is_file():  # resumable
            print(main(args.dataset, args.seed, args.partition, i, learns=part == 0))

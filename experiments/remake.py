"""Which committed results were made by code that has changed since, and remaking them.

Usage: ``.venv/bin/python -m experiments.remake [--run]``

Every results file the docs read records the fingerprint of the code that shapes
its numbers (:data:`experiments.time_saved.SHAPING`; a run that reports an audit,
the verification runs and the default run, also that of the audits' code,
:func:`~experiments.time_saved.audit_fingerprint`); the claims tests fail once
today's differs. This lists, per kind, the files whose fingerprint is not today's:

- ``modelled``: the cost-only remakes of the schedule and paper-scale files
  (``docs/results/{paper-scale,wall,wall/shipped}/modelled/``;
  :mod:`experiments.remodel`, about a minute each on one core);
- ``own``: real runs that priced themselves (``paper-scale/clients/``,
  ``paper-scale/baselines/``); remade by a cost-only run beside them
  (``remodel --folder``), which marks a framework whose schedule depends on the
  updates' values *stale* (SE-R, FRec) until the run itself is repeated;
- ``sweep``: the time-saved sweeps (``docs/results/time-saved/``;
  :mod:`experiments.time_saved`, 2.5-5 min a dataset on one core beside one other
  job (``benchmarks/sweep_bench.py``), since every client's run copies one
  learning; 25-45 min before);
- ``verification``: the runs of "Forgetting verified"
  (``docs/results/verification/{verify,verify-clean,memorize}-seed*.json``;
  ``run_inprocess.py``, 3-15 min a run on one core), then its tables
  (:mod:`experiments.verified_tables`);
- ``default-run``: ``docs/results/default-run/`` (``./simulate.sh`` on a quiet
  machine, then its README's fingerprint lines; printed, never run here).

``--stamp-audits`` adds the audits' fingerprint to a verification file made
before runs recorded it, where the audits' code at the file's commit is
today's (:func:`stamp_audits`); the others stay stale.

With ``--run`` it remakes the first four kinds in that order (then the
verification tables), one command at a
time (each resumable: a killed sweep goes on where it stopped), and prints the
command for the default run; ``--jobs N`` runs N of the commands at once, longest
first, each on one thread (``OMP_NUM_THREADS=1`` unless set), then the tables
(the commands write disjoint files, so their order does not change what they
write). Exit status: 0 when nothing is stale (after the remaking), 1 otherwise.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cli.terminal import Parser
from experiments.time_saved import (
    AUDITING,
    OUT,
    SHAPING,
    audit_fingerprint,
    fingerprint,
    fingerprint_at,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
MODELLED = ("paper-scale", "wall", "wall/shipped")
"""The folders whose ``modelled/`` files are cost-only remakes."""
OWN = ("paper-scale/clients", "paper-scale/baselines")
VERIFIED = {"verify-seed": ("verify",), "memorize-seed": ("memorize",),
            "verify-clean-seed": ("verify", "backdoor-fraction=0.0", 'frameworks="SE"')}
"""The folders of real runs that record their own fingerprint."""
DEFAULT_RUN = RESULTS / "default-run" / "README.md"


def _made_by(path: Path, key: str = "fingerprint") -> str | None:
    """The fingerprint ``key`` a results file records (None: none)."""
    return json.loads(path.read_text()).get(key)


AUDIT_LINE = re.compile(r"Audit code fingerprint .*?`([0-9a-f]{64})`", re.S)
"""The default run's README line of :func:`~experiments.time_saved.audit_fingerprint`."""


def stale(today: str | None = None, audited: str | None = None) -> dict[str, list[Path]]:
    """Per kind, the files made by code other than today's (see the module's list).

    ``today``, ``audited``: today's fingerprint and audit fingerprint (computed
    when not given).
    """
    today, audited = today or fingerprint(), audited or audit_fingerprint()
    out: dict[str, list[Path]] = {"modelled": [], "own": [], "sweep": [],
                                  "verification": [], "default-run": []}
    for folder in MODELLED:
        remade = sorted((RESULTS / folder / "modelled").glob("*.json"))
        out["modelled"] += [p for p in remade if _made_by(p) != today]
    for folder in OWN:
        for path in sorted((RESULTS / folder).glob("explore-*-s*.json")):
            remade = path.parent / "modelled" / path.name
            made = _made_by(remade) if remade.is_file() else _made_by(path)
            if made is not None and made != today:
                out["own"].append(path)
    out["sweep"] = [p for p in sorted(OUT.glob("*.json")) if _made_by(p) != today]
    out["verification"] = [p for stem in VERIFIED
                           for p in sorted((RESULTS / "verification").glob(f"{stem}*.json"))
                           if _made_by(p) != today
                           or _made_by(p, "audit_fingerprint") != audited]
    text = DEFAULT_RUN.read_text()
    found = re.search(r"Code fingerprint .*?`([0-9a-f]{64})`", text, re.S)
    audit = AUDIT_LINE.search(text)
    if not found or found.group(1) != today or not audit or audit.group(1) != audited:
        out["default-run"].append(DEFAULT_RUN)
    return out


def commands(files: dict[str, list[Path]]) -> list[list[str]]:
    """The commands that remake ``files`` (all kinds but the default run)."""
    python = [sys.executable, "-m"]
    out = []
    for kind in ("modelled", "own"):
        by_folder: dict[Path, list[str]] = {}
        for path in files[kind]:
            source = path.parent.parent if kind == "modelled" else path.parent
            by_folder.setdefault(source, []).append(path.name)
        out += [[*python, "experiments.remodel", "--folder", str(folder), *names]
                for folder, names in by_folder.items()]
    out += [[*python, "experiments.time_saved", path.stem] for path in files["sweep"]]
    runner = str(RESULTS / "verification" / "run_inprocess.py")
    for path in files["verification"]:
        stem, seed = path.stem.rsplit("seed", 1)
        preset, *pairs = VERIFIED[stem + "seed"]
        out.append([sys.executable, runner, preset, str(ROOT / ".remake-runs"),
                    f"seed={seed}", *pairs, "--into", str(path)])
    if files["verification"]:
        out.append([*python, "experiments.verified_tables", "--write"])
    return out


def by_length(todo: list[list[str]]) -> list[list[str]]:
    """``todo`` longest first: sweeps, verification runs, remodels, the tables.

    The order :func:`run_all` starts them in with ``jobs`` > 1.
    """
    def rank(command: list[str]) -> int:
        if "experiments.verified_tables" in command:
            return 3
        return 0 if "experiments.time_saved" in command else 1 if "--into" in command else 2

    return sorted(todo, key=rank)


def run_all(todo: list[list[str]], jobs: int) -> None:
    """Run ``todo``, ``jobs`` at a time; the tables (if any) after every other.

    Raises
    ------
    subprocess.CalledProcessError
        A command failed (the others already started finish first).
    """
    def start(command: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
        print("running: " + " ".join(command[1:]), flush=True)  # when it starts
        return subprocess.run(command, cwd=ROOT, env=env)

    if jobs <= 1:
        for command in todo:
            start(command).check_returncode()
        return
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    ordered = by_length(todo)
    tables = [c for c in ordered if "experiments.verified_tables" in c]
    with ThreadPoolExecutor(jobs) as pool:
        done = list(pool.map(lambda c: start(c, env),
                             [c for c in ordered if c not in tables]))
    for result in done:
        if result.returncode:
            raise subprocess.CalledProcessError(result.returncode, result.args)
    for command in tables:
        start(command, env).check_returncode()


def stamp_audits() -> list[Path]:
    """Add ``audit_fingerprint`` to the verification files that lack it, where it holds.

    A file made by today's :data:`~experiments.time_saved.SHAPING` code (its
    ``fingerprint``) at a commit whose :data:`~experiments.time_saved.AUDITING`
    code is today's too was made by today's audits: it gets today's audit
    fingerprint. Any other file is left as it is (stale). Returns the files stamped.
    """
    today, audited, done = fingerprint(), audit_fingerprint(), []
    for stem in VERIFIED:
        for path in sorted((RESULTS / "verification").glob(f"{stem}*.json")):
            data = json.loads(path.read_text())
            if "audit_fingerprint" in data or data.get("fingerprint") != today:
                continue
            try:
                then = fingerprint_at(data["commit"], ROOT, SHAPING + AUDITING)
            except (KeyError, subprocess.CalledProcessError):
                continue  # no commit, or one without the audits' code
            if then == audited:
                path.write_text(json.dumps({**data, "audit_fingerprint": audited},
                                           indent=1))
                done.append(path)
    return done


def main(run: bool = False, jobs: int = 1) -> int:
    """Print what is stale, remake it with ``run``; 0 when nothing is left.

    ``jobs``: commands at once (:func:`run_all`).
    """
    files = stale()
    for kind, paths in files.items():
        print(f"{kind}: {len(paths)} stale" + "".join(
            f"\n  {p.relative_to(ROOT)}" for p in paths))
    todo = commands(files)
    if run:
        run_all(todo, jobs)
    else:
        for command in todo:
            print("to run: " + " ".join(command[1:]), flush=True)
    if files["default-run"]:
        print("then, on a quiet machine: ./simulate.sh, and record "
              "`python -m experiments.time_saved --fingerprint` and "
              "`--audit-fingerprint` in "
              f"{DEFAULT_RUN.relative_to(ROOT)}")
    left = stale() if run else files
    return 0 if not any(left.values()) else 1


if __name__ == "__main__":

    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="remake what is stale")
    parser.add_argument("--jobs", type=int, default=1,
                        help="with --run: commands at once, each on one thread")
    parser.add_argument("--stamp-audits", action="store_true",
                        help="add the audits' fingerprint where the file's commit had "
                             "today's audits")
    args = parser.parse_args()
    if args.stamp_audits:
        for stamped in stamp_audits():
            print(f"stamped: {stamped.relative_to(ROOT)}")
    if args.jobs < 1:
        parser.error(f"--jobs = {args.jobs} must be at least 1")
    sys.exit(main(args.run, args.jobs))

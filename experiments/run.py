"""Run an experiment: ``python -m experiments.run NAME [--suite S] [--out DIR]``.

NAME is ``single``, ``concurrent``, ``storage`` or ``all``; ``pareto`` runs nothing
and redraws ``docs/figures/pareto_<dataset>.png``, ``docs/results/wall/explore.md`` and
the summary tables that open docs/RESULTS.md from the committed schedule files
(:mod:`experiments.pareto`). S, the size of every
run, is ``quick`` (default), ``paper`` or ``tiny`` (the tests): suites, not the
run presets of ``presets/`` (those are for single runs). Every configuration is one run
of the real ServerApp and ClientApp (:mod:`experiments.suites`):

- ``--engine inprocess`` (default): the app's own ``server_app.app.main`` on an
  in-process Grid that calls ``client_app.app:app`` for every message
  (:mod:`experiments.grid`); no Ray, no SuperLink. Same code, same messages,
  delivered one after another in one process.
- ``--engine flwr``: each configuration through ``./simulate.sh`` (``flwr run``
  in Flower's Ray simulation engine, one SuperNode per client).

The output folder (default ``results/experiments/<name>-<suite>-<UTC time>/``)
gets ``runs/<run>/summary.json`` (history stores removed unless
``--keep-history``), ``logs/<run>.log``, ``results.json``, ``results.csv`` (one
row per run and framework), ``storage_sweep.csv``, ``figures/*.png`` and
``report.md``. Rerunning with the same ``--out`` reuses finished runs.
Progress goes to stderr, one line per step, with an estimate of the time left.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from cli.env import back_to_caller, setup_env
from cli.procs import exit_on_signals
from cli.terminal import Parser
from experiments import suites
from experiments.engines import QuietFlower, dataset_available, default_data_dir, run_one
from experiments.progress import Progress
from experiments.progress import clock as _clock
from experiments.suites import RunSpec, StorageSweep

ROOT = suites.ROOT


@dataclass(frozen=True)
class RunSetup:
    """Where and how every run of an experiment runs, and what it keeps.

    Attributes
    ----------
    out : Path
        Output folder; runs whose summary.json is there already are reused.
    data_dir : str
        Datasets folder (``""``: the app's lookup).
    engine : str
        ``inprocess`` or ``flwr`` (:func:`experiments.engines.run_one`).
    keep_history : bool
        Keep each run's ``history/`` and ``models/``.
    """

    out: Path
    data_dir: str = ""
    engine: str = "inprocess"
    keep_history: bool = False


def _available(experiment: str, suite: str, datasets: tuple[str, ...] | None,
               data_dir: str, methods: tuple[str, ...] = (),
               only: tuple[str, ...] = ()) -> tuple[list[RunSpec], dict[str, str]]:
    """The runs of ``experiment`` whose dataset loads here, and why the others not.

    ``methods`` run beside SE (:func:`experiments.suites.with_methods`); ``only``
    keeps the runs whose name matches a pattern (:func:`experiments.suites.select`).
    """
    specs = suites.select(
        suites.with_methods(suites.plan(experiment, suite, datasets), methods), only)
    skipped: dict[str, str] = {}
    for dataset in sorted({s.config["dataset"] for s in specs}):
        why = dataset_available(dataset, data_dir)
        if why:
            skipped[dataset] = why
    return [s for s in specs if s.config["dataset"] not in skipped], skipped


def _nothing_to_run(experiment: str, suite: str, datasets: tuple[str, ...] | None,
                    data_dir: str, methods: tuple[str, ...], only: tuple[str, ...]
                    ) -> None:
    """Raise ValueError (one line) when the command would run nothing it was asked to.

    A dataset named with ``--datasets`` that does not load here, or an experiment
    with runs none of whose datasets loads (e.g. ``--data-dir`` naming no
    datasets); a dataset missing among others is skipped and said in the report.
    """
    specs, skipped = _available(experiment, suite, datasets, data_dir, methods, only)
    named = [d for d in datasets or () if d in skipped]
    if named:
        raise ValueError(f"--datasets {named[0]!r}: {skipped[named[0]]}")
    if skipped and not specs:
        reasons = "; ".join(f"{d}: {why}" for d, why in sorted(skipped.items()))
        raise ValueError(f"no run of {experiment} can run here: {reasons}")


def _run_sweep(sweep: StorageSweep, out: Path, results: dict) -> str:
    """Measure the storage sweep into ``results``; return the step's status."""
    from experiments import storage

    try:
        (out / "logs").mkdir(parents=True, exist_ok=True)
        with QuietFlower(out / "logs" / "storage-sweep.log"):
            results["storage_sweep"] = storage.sweep(sweep.clients, sweep.rounds)
        results["storage_sweep_source"] = storage.SOURCE
    except Exception as err:  # noqa: BLE001 - record, go on
        results["storage_sweep_error"] = traceback.format_exc()
        return f"failed ({type(err).__name__}: {err})"
    return "done"


def _run_spec(spec: RunSpec, setup: RunSetup) -> tuple[dict, str]:
    """Run ``spec`` (or reuse its summary); its results.json entry and status."""
    out = setup.out
    t0 = time.perf_counter()
    entry = {"spec": asdict(spec), "status": "done", "summary": None, "error": None}
    status = "done"
    existing = out / "runs" / spec.name / "summary.json"
    try:
        if existing.is_file():
            path, status = existing, "reused"
        else:
            path = run_one(spec, out, setup.data_dir, setup.engine)
        entry["summary"] = str(path.relative_to(out.resolve())
                               if path.is_absolute() else path)
        if not setup.keep_history:
            shutil.rmtree(path.parent / "history", ignore_errors=True)
            shutil.rmtree(path.parent / "models", ignore_errors=True)
    except Exception as err:  # noqa: BLE001 - one failed run must not end all
        status = f"failed ({type(err).__name__}: {err})"
        entry.update(status="failed", error=traceback.format_exc())
    entry["wall_s"] = time.perf_counter() - t0
    return entry, status


def _run_step(i: int, step: RunSpec | StorageSweep, progress: Progress, results: dict,
              setup: RunSetup) -> None:
    progress.start(i, step.experiment, step.name)
    t0 = time.perf_counter()
    if isinstance(step, StorageSweep):
        status = _run_sweep(step, setup.out, results)
    else:
        entry, status = _run_spec(step, setup)
        results["runs"].append(entry)
    progress.finish(i, step.experiment, step.name, time.perf_counter() - t0, status)
    _write_json(setup.out / "results.json", results)


def _worker_threads(threads: int) -> None:
    """A job process's torch threads (the ServerApp's evaluation; clients set their own)."""
    import torch

    torch.set_num_threads(threads)


def _run_parallel(specs: list[RunSpec], progress: Progress, results: dict,
                  setup: RunSetup, jobs: int) -> None:
    """Run ``specs`` in ``jobs`` worker processes; results.json keeps the plan's order.

    Each job is its own process (spawned, so no torch or Flower state is shared)
    with ``cores // jobs`` torch threads; a run's compute seconds are then its own
    core's, as in the one-job loop.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    entries: dict[int, dict] = {}
    threads = max(1, (os.cpu_count() or 1) // jobs)
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_threads, initargs=(threads,)) as pool:
        futures = {}
        for i, spec in enumerate(specs):
            futures[pool.submit(_run_spec, spec, setup)] = i
        started = min(jobs, len(specs))  # the pool takes the specs in order
        for i in range(started):
            progress.start(i, specs[i].experiment, specs[i].name)
        for future in as_completed(futures):
            i = futures[future]
            try:
                entry, status = future.result()
            except Exception as err:  # noqa: BLE001 - e.g. a job process killed
                status = f"failed ({type(err).__name__}: {err})"
                entry = {"spec": asdict(specs[i]), "status": "failed", "summary": None,
                         "error": traceback.format_exc(), "wall_s": 0.0}
            entries[i] = entry
            progress.finish(i, specs[i].experiment, specs[i].name, entry["wall_s"], status)
            if started < len(specs):
                progress.start(started, specs[started].experiment, specs[started].name)
                started += 1
            results["runs"] = [entries[k] for k in sorted(entries)]
            _write_json(setup.out / "results.json", results)


def execute(experiment: str, suite: str, setup: RunSetup,
            datasets: tuple[str, ...] | None = None, *, stream=None, jobs: int = 1,
            methods: tuple[str, ...] = (), only: tuple[str, ...] = ()) -> dict:
    """Run ``experiment`` of ``suite`` into ``setup.out``: results, figures, report.md.

    Parameters
    ----------
    experiment : str
        ``single``, ``concurrent``, ``storage`` or ``all``.
    suite : str
        ``quick``, ``trained``, ``paper`` or ``tiny`` (:data:`experiments.suites.SUITES`).
    setup : RunSetup
        ``out``: output folder (runs whose summary.json is there already are
        reused); ``data_dir``: datasets folder (``""``: the app's lookup; a
        dataset that does not load is skipped, with the reason in ``skipped``);
        ``engine``: ``inprocess`` or ``flwr``; ``keep_history``: keep each run's
        ``history/`` and ``models/``.
    datasets : tuple[str, ...], optional
        The datasets to run it on (default: the experiment's own; any other
        built-in one runs the same cells on that dataset).
    stream : file, optional
        Where progress lines go (default stderr).
    jobs : int
        Runs side by side, each in its own process (:func:`_run_parallel`);
        1 runs them one after another in this process.
    methods : tuple[str, ...]
        Unlearning methods of one's own (``package.module:Class``) run beside SE
        in every run that runs SE.
    only : tuple[str, ...]
        Shell-style patterns: run only the runs whose name matches one
        (:func:`experiments.suites.select`; ``()``: every run).

    Returns
    -------
    dict
        What results.json holds: ``runs`` (spec, status, summary path, wall
        seconds, error), ``storage_sweep`` rows, ``skipped`` datasets, settings.
    """
    stream = sys.stderr if stream is None else stream
    out = setup.out
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    specs, skipped = _available(experiment, suite, datasets, setup.data_dir, methods,
                                only)
    steps: list[RunSpec | StorageSweep] = list(specs)
    if experiment in ("storage", "all"):
        steps.append(suites.storage_sweep(suite))
    progress = Progress([step.weight for step in steps], stream, jobs)
    results = {"experiment": experiment, "suite": suite, "engine": setup.engine,
               "jobs": jobs, "methods": list(methods), "only": list(only),
               "data_dir": setup.data_dir, "settings": suites.suite_settings(suite),
               "skipped": skipped, "runs": [], "storage_sweep": [],
               "storage_sweep_source": None, "machine": machine()}
    for why in skipped.values():
        print(f"skipping a dataset: {why}", file=stream, flush=True)
    try:
        if jobs > 1 and len(specs) > 1:
            _run_parallel(specs, progress, results, setup, jobs)
            steps = steps[len(specs):]  # the storage sweep, after the runs
        for i, step in enumerate(steps, start=len(results["runs"])):
            _run_step(i, step, progress, results, setup)
    finally:
        progress.close()
    results["wall_s"] = time.perf_counter() - t_start
    write_outputs(results, out)
    print(f"report: {(out / 'report.md').resolve()}", file=stream, flush=True)
    return results


def write_outputs(results: dict, out: Path) -> None:
    """results.json, results.csv, storage_sweep.csv, figures/ and report.md."""
    from experiments import figures, report
    from experiments.collect import load_rows, write_csv

    rows = load_rows(results, out)
    write_csv(out / "results.csv", rows)
    write_csv(out / "storage_sweep.csv", results["storage_sweep"])
    results["figures"] = figures.make_all(results, rows, out / "figures")
    _write_json(out / "results.json", results)
    (out / "report.md").write_text(report.render(results, rows, out))


def rebuild_report(out: Path) -> Path:
    """Redraw the outputs of ``out`` from its results.json (no runs).

    Raises
    ------
    FileNotFoundError
        ``out`` lacks results.json or a finished run's summary.json (a folder
        whose runs/ were left out, e.g. a committed summary); nothing is written.
    """
    if not (out / "results.json").is_file():
        raise FileNotFoundError(f"--out {out}: no results.json to redraw from")
    results = json.loads((out / "results.json").read_text())
    missing = [e["summary"] for e in results["runs"]
               if e.get("status") != "failed" and e.get("summary")
               and not (out / e["summary"]).is_file()]
    if missing:
        raise FileNotFoundError(
            f"--out {out}: {len(missing)} run(s) lack their summary.json (first: "
            f"{missing[0]}); the report is redrawn from each run's summary.json")
    write_outputs(results, out)
    return out / "report.md"


def machine() -> dict:
    """CPU count and model, Python and torch versions (for report.md)."""
    import platform

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_version = "?"
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "torch": torch_version, "platform": platform.platform()}


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


def _parser() -> argparse.ArgumentParser:
    """The ``experiments`` command line."""
    ap = Parser(
        prog=("./simulate.sh experiments" if os.environ.get("SE_CLI_PROG")
              else "python -m experiments.run"),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", choices=[*suites.EXPERIMENTS, "all", "pareto"])
    ap.add_argument("--suite", default="quick", choices=suites.SUITES,
                    help="the size of every run (default: quick)")
    ap.add_argument("--preset", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help="output folder (default "
                    "results/experiments/<name>-<suite>-<UTC time>)")
    ap.add_argument("--engine", default="inprocess", choices=("inprocess", "flwr"))
    ap.add_argument("--data-dir", default="", help="datasets (default $SE_DATA_DIR "
                    "or ../shared/data)")
    ap.add_argument("--datasets", default="", help="comma-separated datasets to run "
                    "the experiment on, its own or others (e.g. the concurrent "
                    "cells on fmnist; default: the experiment's own)")
    ap.add_argument("--jobs", type=int, default=1, help="runs side by side, each in "
                    "its own process with cores/jobs torch threads (default 1; "
                    "engine inprocess only)")
    ap.add_argument("--methods", default="", metavar="package.module:Class,...",
                    help="unlearning methods of one's own (docs/TASKS.md) or built-in "
                    "frameworks (SE-R, FRec), run beside SE in every run that runs SE")
    ap.add_argument("--only", default="", metavar="PATTERN,...",
                    help="run only the runs whose name matches one of these "
                    "shell-style patterns, e.g. '*-noniid-s0*' (default: every run; "
                    "the storage sweep, which trains nothing, still runs)")
    ap.add_argument("--keep-history", action="store_true",
                    help="keep each run's history stores and models")
    ap.add_argument("--report-only", action="store_true",
                    help="redraw the figures and report.md of --out from its "
                    "results.json; run nothing")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the experiment."""
    ap = _parser()
    args = ap.parse_args(argv)
    if args.preset is not None:
        ap.error(f"--preset {args.preset}: the experiments take --suite "
                 f"{'|'.join(suites.SUITES)}; --preset names a run preset "
                 "(presets/NAME.toml) of ./simulate.sh [run|deploy]")
    if not 1 <= args.jobs <= (os.cpu_count() or 1):
        ap.error(f"--jobs {args.jobs}: allowed 1 to the machine's {os.cpu_count()} cores")
    if args.jobs > 1 and args.engine != "inprocess":
        ap.error(f"--jobs {args.jobs} with --engine {args.engine}: side-by-side runs "
                 "need --engine inprocess (each flwr run starts its own SuperLink)")
    if args.name == "pareto":  # redraws from committed files; runs nothing
        from experiments import doc_tables, pareto

        given = [f"--{k.replace('_', '-')}" for k, v in vars(args).items()
                 if k != "name" and v != ap.get_default(k)]
        if given:
            ap.error(f"pareto redraws from the committed files and takes no options: "
                     f"{', '.join(given)} given")

        for path in doc_tables.redraw(pareto.FILES, pareto.FIGURES, doc_tables.RESULTS,
                                      doc_tables.README, pareto.PAPER_SCALE):
            print(f"wrote {path}", file=sys.stderr)
        return 0
    if args.report_only:
        if not args.out:
            ap.error("--report-only needs --out")
        try:
            path = rebuild_report(Path(args.out))
        except FileNotFoundError as err:
            ap.error(str(err))
        print(f"report: {path.resolve()}", file=sys.stderr)
        return 0
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    results_root = Path(os.environ.get("SE_RESULTS_DIR", ROOT / "results"))
    out = Path(args.out) if args.out else \
        results_root / "experiments" / f"{args.name}-{args.suite}-{stamp}"
    datasets = tuple(d.strip() for d in args.datasets.split(",") if d.strip()) or None
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    only = tuple(p.strip() for p in args.only.split(",") if p.strip())
    if out.exists() and not out.is_dir():
        ap.error(f"--out {str(out)!r} is a file, not a folder")
    data_dir = args.data_dir or default_data_dir()
    try:  # before any run: a pattern that matches nothing is a typo
        _nothing_to_run(args.name, args.suite, datasets, data_dir, methods, only)
    except ValueError as err:
        ap.error(str(err))
    setup = RunSetup(out, data_dir, args.engine, args.keep_history)
    results = execute(args.name, args.suite, setup, datasets, jobs=args.jobs,
                      methods=methods, only=only)
    failed = [r["spec"]["name"] for r in results["runs"] if r["status"] == "failed"]
    print(f"{args.name} ({args.suite}): {len(results['runs']) - len(failed)} runs "
          f"done, {len(failed)} failed, {_clock(results['wall_s'])}; "
          f"{out.resolve()}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    back_to_caller()  # ./simulate.sh experiments: --out and --data-dir are the caller's
    setup_env()
    exit_on_signals("experiments")  # a signal stops the runs it started (Children)
    raise SystemExit(main())

"""How far the run config travels: the project's functions that receive it (issue 53).

Usage::

    .venv/bin/python benchmarks/config_stops.py [--list]

Runs one small seeded run in process (:func:`experiments.grid.run_in_process`:
the default dataset, 8 clients, 2 shards, 2 rounds of 1 local epoch, SE and FR forgetting
client 1, no audit) under :func:`sys.setprofile`, and records every call of a
project function (a file of this checkout outside ``tests/``) with an argument
that carries the run's settings:

- the whole config: a :class:`~server_app.config.RunConfig`, a
  :class:`~server_app.run.context.RunContext` or an unlearning
  :class:`~server_app.unlearning.frameworks.Stage` (each holds one), Flower's
  ``Context`` or the flat run-config mapping (a ``Mapping`` with the keys
  :data:`FLAT`);
- a part of it: a settings section (:class:`task.section.Section`: the data,
  training, unlearning, storage, ... sections and a method's own settings) or
  the frozen :class:`~server_app.run.plan.RunPlan`.

Prints the *stops* (distinct functions reached with the whole config; with a
part of it), the files they are in, and the deepest *chain*: the most frames
holding the whole config on the stack at once (the path a value of the config
takes from ``run_in_process`` down). ``--list`` names them. The counts are of
this checkout's code on this run: a measure to compare commits by, not the
issue's hand count (38 stops in 16 files at 0571373, counted otherwise).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUN = {"num-clients": 8, "num-shards": 2, "clients-per-round": 4,
       "num-rounds": 2, "local-epochs": 1, "client-samples": 32, "test-samples": 64,
       "batch-size": 16, "mia": False, "frameworks": "SE,FR", "forget-clients": "1",
       "run-name": "stops"}


FLAT = {"num-rounds", "frameworks", "local-epochs"}
"""Keys that make a mapping the flat run config (a round's train config has fewer)."""


def _kinds():
    """(whole-config types, part-of-config types)."""
    from flwr.app import Context

    from server_app.config import RunConfig
    from server_app.run.context import RunContext
    from server_app.run.plan import RunPlan
    from server_app.unlearning.frameworks import Stage
    from task.section import Section

    return (RunConfig, RunContext, Context, Stage), (Section, RunPlan)


def _carries(value, whole, part) -> str | None:
    """``"whole"``, ``"part"`` or None: what of the run config ``value`` carries."""
    if isinstance(value, whole) or (isinstance(value, Mapping) and FLAT <= value.keys()):
        return "whole"
    return "part" if isinstance(value, part) else None


def measure(data_dir: str) -> dict:
    """Run :data:`RUN` under the profiler; the stops, files and deepest chain."""
    from experiments.grid import run_in_process

    whole, part = _kinds()
    root, tests = str(ROOT) + "/", str(ROOT / "tests") + "/"
    stops: dict[str, set[str]] = {"whole": set(), "part": set()}
    chain: list[str] = []
    deepest: list[str] = []

    def profile(frame, event, _arg):
        nonlocal deepest
        path = frame.f_code.co_filename
        if not path.startswith(root) or path.startswith(tests) or "/.venv/" in path:
            return
        name = f"{path[len(root):]}:{frame.f_code.co_qualname}"
        if event == "return":
            if chain and chain[-1] == name:
                chain.pop()
            return
        if event != "call":
            return
        code = frame.f_code
        args = [frame.f_locals.get(a) for a in code.co_varnames[:code.co_argcount
                                                               + code.co_kwonlyargcount]]
        kinds = {_carries(a, whole, part) for a in args} - {None}
        for kind in kinds:
            stops[kind].add(name)
        if "whole" in kinds:
            chain.append(name)
            if len(chain) > len(deepest):
                deepest = list(chain)

    with tempfile.TemporaryDirectory() as folder:
        sys.setprofile(profile)
        try:
            run_in_process({**RUN, "data-dir": data_dir, "results-dir": folder})
        finally:
            sys.setprofile(None)
    stops["part"] -= stops["whole"]
    return {"whole": sorted(stops["whole"]), "part": sorted(stops["part"]),
            "deepest": deepest}


def main(argv: list[str]) -> None:
    import os

    data = os.environ.get("SE_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    found = measure(data)
    for kind, label in (("whole", "the whole config"), ("part", "a part of it only")):
        files = {n.split(":")[0] for n in found[kind]}
        print(f"functions reached with {label}: {len(found[kind])} in {len(files)} files")
        if "--list" in argv:
            print("\n".join(f"  {n}" for n in found[kind]))
    print(f"deepest chain holding the whole config: {len(found['deepest'])} frames")
    if "--list" in argv:
        print("\n".join(f"  {n}" for n in found["deepest"]))


if __name__ == "__main__":
    main(sys.argv[1:])

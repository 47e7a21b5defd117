"""Calibrate a device profile: time each task's per-sample training on this machine.

    python benchmarks/calibrate_profile.py [--tasks SPEC,...] [--out FILE]
        [--name NAME] [--batches 8] [--warmup 2] [--batch-size 32]

For each task (default: every built-in, :data:`task.tasks.BUILTIN_TASKS`; a plug-in
by its ``package.module:factory`` spec) this loads the task's data as a run does,
builds its model and, on one thread (``torch.set_num_threads(1)``, as each
ClientApp trains), times its local training step (:attr:`task.interface.Task.train`,
SGD, the default lr and momentum) on ``--batches`` mini-batches of ``--batch-size``
after ``--warmup`` untimed ones; the best of three repeats, divided by the samples,
is ``train_s_per_sample``. RapidRetrain's Fisher estimate
(:func:`task.train.fisher_preconditioner`, one gradient a sample) is timed the same
way (``fisher_s_per_sample``). The server's costs are timed on NumPy arrays of the
largest task's size: FedAvg's weighted step (``aggregate_s_per_param``, per
parameter of each update, with FedEraser's calibration of each update), a model's
copy into a message (``configure_s_per_param``) and an erasure decoding of coded
slices (``decode_s_per_op``, per slice value x block), each the best of seven.

Run it alone (nothing else busy): it prints each number and the machine's load
average before and after, and records the machine, command, commit, date and load
in the profile's ``[calibration]`` table. The shipped ``cpu-core`` profile was
written by it (docs/DESIGN.md, "The cost model").
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coding.decode import decode_erasures  # noqa: E402
from server_app.config.profile import DEFAULT_PROFILE, PROFILE_DIR  # noqa: E402
from strategies.calibration import calibrate, weighted_step  # noqa: E402
from task.config import TaskConfig, fused_run_config  # noqa: E402
from task.registry import get_task, load_data  # noqa: E402
from task.tasks import BUILTIN_TASKS  # noqa: E402
from task.train import fisher_preconditioner  # noqa: E402
from task.training_settings import TrainingSettings  # noqa: E402

REPEATS = 3
SERVER_REPEATS = 7  # memory-bound NumPy steps vary more on a shared machine


def best_of(fn, repeats: int = REPEATS) -> float:
    """The shortest of ``repeats`` timings of ``fn()``, seconds."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def task_data(spec: str):
    """(task, its training x, y, number of classes) loaded as a run loads them."""
    settings = TaskConfig.from_run_config(fused_run_config({"task": spec}))
    task = get_task(spec)
    data = load_data(task, settings, str(task.locate("")))
    return task, data.train_x, data.train_y, data.num_classes


def time_task(spec: str, batches: int, warmup: int, batch_size: int) -> dict:
    """Per-sample training and Fisher seconds of one task (module docstring)."""
    task, x, y, classes = task_data(spec)
    torch.manual_seed(0)
    model = task.model(classes)
    n = batches * batch_size

    def train(count: int) -> None:
        task.train(model, x[:count], y[:count], TrainingSettings(
            lr=0.05, local_epochs=1, batch_size=batch_size, momentum=0.5), seed=0,
            device="cpu")

    train(warmup * batch_size)
    train_s = best_of(lambda: train(n)) / n
    fisher_n = min(n, 64)
    fisher_preconditioner(model, x[:8], y[:8], samples=8, device="cpu")  # warm-up
    fisher_s = best_of(lambda: fisher_preconditioner(
        model, x[:fisher_n], y[:fisher_n], samples=fisher_n, device="cpu")) / fisher_n
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{task.name}: {train_s * 1e3:.4f} ms/sample training, "
          f"{fisher_s * 1e3:.4f} ms/sample Fisher, {parameters} parameters", flush=True)
    return {"name": task.name, "spec": spec, "train_s_per_sample": train_s,
            "fisher_s_per_sample": fisher_s, "parameters": parameters}


def time_server(parameters: int, updates: int = 10) -> dict:
    """Per-parameter server costs on arrays of ``parameters`` float32 values."""
    rng = np.random.default_rng(0)
    base = {"w": rng.standard_normal(parameters).astype(np.float32)}
    ups = [{"w": rng.standard_normal(parameters).astype(np.float32)}
           for _ in range(updates)]

    def aggregate() -> None:
        weighted_step(base, [calibrate(u, ups[0]) for u in ups], [1.0] * updates)

    aggregate()
    aggregate_s = best_of(aggregate, SERVER_REPEATS) / (parameters * updates)
    configure_s = best_of(lambda: [base["w"].copy() for _ in range(updates)],
                          SERVER_REPEATS) / (parameters * updates)
    decode_s = time_decode()
    print(f"server: {aggregate_s * 1e9:.3f} ns/param aggregate, {configure_s * 1e9:.3f} "
          f"ns/param configure, {decode_s * 1e9:.3f} ns/op decode", flush=True)
    return {"configure_s_per_param": configure_s, "aggregate_s_per_param": aggregate_s,
            "decode_s_per_op": decode_s}


def time_decode(k: int = 8, block_len: int = 20_000) -> float:
    """Seconds per slice value x block of an erasure decoding (k blocks, k slices)."""
    rng = np.random.default_rng(0)  # any field elements: decoding is a matrix product
    slices = rng.integers(0, 2**31 - 1, size=(k, block_len), dtype=np.int64)
    omegas = np.arange(1, k + 1, dtype=np.int64)
    alphas = np.arange(k + 1, 3 * k + 1, dtype=np.int64)
    decode_erasures(slices, alphas[:k], omegas)  # warm-up (compilation)
    return best_of(lambda: decode_erasures(slices, alphas[:k], omegas),
                   SERVER_REPEATS) / (slices.size * k)


def git_commit() -> str:
    """This checkout's commit (``+dirty`` with uncommitted changes), or ``unknown``."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, check=True, capture_output=True,
                               text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine() -> str:
    """The CPU model, cores and OS of this machine."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}; {os.cpu_count()} logical cores; {platform.platform()}"


def toml_profile(name: str, tasks: list[dict], server: dict, calibration: dict) -> str:
    """The profile file's text (:mod:`server_app.config.profile`'s schema)."""
    ratios = sorted(t[k] / t["parameters"] for t in tasks
                    for k in ("train_s_per_sample",))
    fisher = sorted(t["fisher_s_per_sample"] / t["parameters"] for t in tasks)
    lines = [
        "# Written by benchmarks/calibrate_profile.py: measured, not edited by hand.",
        f"name = {_toml(name)}",
        'description = "One core of the machine named in [calibration], measured by '
        'benchmarks/calibrate_profile.py on one thread; load_average_* say how busy '
        'the machine was"',
        "measured = true", "",
        "[calibration]",
        *(f"{k} = {_toml(v)}" for k, v in calibration.items()), "",
        "[link]", "base_delay_s = 0.1  # the paper's Sec. 5; rate: run-config "
        "link-rate-mbps", "",
        "[server]", *(f"{k} = {v!r}" for k, v in server.items()), "",
        "[fallback]  # a task without an entry: its parameters x these (the median "
        "over the tasks below)",
        f"train_s_per_param_sample = {ratios[len(ratios) // 2]!r}",
        f"fisher_s_per_param_sample = {fisher[len(fisher) // 2]!r}", "",
        "[stragglers]", "fraction = 0.0", "slowdown = 1.0", "seed = 0", ""]
    for t in tasks:
        lines += [f'[tasks."{t["name"]}"]', f'spec = "{t["spec"]}"',
                  f"train_s_per_sample = {t['train_s_per_sample']!r}",
                  f"fisher_s_per_sample = {t['fisher_s_per_sample']!r}",
                  f"parameters = {t['parameters']}", ""]
    return "\n".join(lines)


def _toml(value) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def main(argv: list[str] | None = None) -> None:
    """Time every task and the server's steps; write the profile."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(BUILTIN_TASKS))
    parser.add_argument("--out", default=str(PROFILE_DIR / f"{DEFAULT_PROFILE}.toml"))
    parser.add_argument("--name", default=DEFAULT_PROFILE)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    tasks = [time_task(spec, args.batches, args.warmup, args.batch_size)
             for spec in args.tasks.split(",")]
    server = time_server(max(t["parameters"] for t in tasks))
    load_after = os.getloadavg()
    calibration = {
        "machine": machine(), "command": shlex.join(["python", *sys.argv]),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__, "threads": 1, "batch_size": args.batch_size,
        "timed_batches": args.batches, "warmup_batches": args.warmup,
        "repeats": REPEATS, "server_repeats": SERVER_REPEATS,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after]}
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          f"({os.cpu_count()} cores)", flush=True)
    Path(args.out).write_text(toml_profile(args.name, tasks, server, calibration))
    print(f"profile: {args.out}")


if __name__ == "__main__":
    main()

"""How close SE-R's L-BFGS estimates come on the paper preset (issue 26's SE-R goal).

Usage: ``.venv/bin/python docs/results/recovery/estimator.py SEED`` writes
``estimator-seed<SEED>.json`` here and prints the table of every such file.

One shard of ``presets/paper.toml`` with ``partition = "noniid"`` (25 of the
preset's 100 MNIST clients, 5 a round, 30 rounds x 10 local epochs) is learned in
process with its history (:func:`in_process.learn_with_history`); then the first participant
of round 1 is forgotten and :class:`strategies.recovery_replay.RecoveryReplay` recovers
the shard with SE-R's default keys, as the run does. In every round each retained
participant is *also* trained from the recovered model W'^(k-1) (its true
U'_i), which the recovery never sees: the estimates it used are compared with it.

Per estimated update (measured):

- ``gain`` = |U'_est - U'| / |U' - U|: below 1, the L-BFGS correction moved the
  stored update U toward the true one; 1, no better than using U as it is; above
  1, worse (round 1, where W' = W and the stored updates are used as they are,
  has none);
- ``stored_error`` = |U - U'| / |U'|: how far the stored update itself is.

``asked`` counts the participants the round asked to train (exact rounds, and the
estimates the abnormality check rejected).
"""

import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(HERE)]

SHARD_CLIENTS, PER_ROUND = 25, 5


def _setup(seed: int):
    """The paper preset's run config, the task and the shard's 25 clients' data."""
    from cli.config import preset_values
    from server_app.config import RunConfig
    from task.config import fused_run_config
    from task.builtin import load_task_data
    from task.data import client_data

    preset = preset_values("paper")
    data_dir = str(ROOT.parent / "shared" / "data")
    cfg = RunConfig.from_run_config(fused_run_config(
        {**preset, "partition": "noniid", "seed": seed, "data-dir": data_dir}))
    task = load_task_data("mnist", data_dir)
    parts = [client_data(task, c, preset["num-clients"], "noniid", seed)
             for c in range(SHARD_CLIENTS)]
    return cfg, task, parts


def _accuracy(cfg, task, state: dict) -> float:
    spec = cfg.task()
    model = spec.model(task.num_classes)
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})
    return spec.score(spec.predict(model, task.test_x), task.test_y.numpy())[1]


def _row(k: int, exact: bool, asked: int, estimates: dict, truth: dict,
         stored: dict) -> dict:
    """One round's measurements (``estimates``, ``truth``, ``stored``: flat U's)."""
    gains = [float(np.linalg.norm(estimates[c] - truth[c])
                   / np.linalg.norm(truth[c] - stored[c])) for c in estimates
             if np.any(truth[c] != stored[c])]  # round 1: W' = W, U' = U
    errors = [float(np.linalg.norm(stored[c] - truth[c]) / np.linalg.norm(truth[c]))
              for c in truth]
    return {"round": k, "exact": exact, "asked": asked, "estimated": len(estimates),
            "gain": gains, "stored_error": errors}


def measure(seed: int) -> dict:
    """Learn the shard, recover it without its first participant, measure the estimates."""
    from in_process import (
        ReferenceHistory,
        learn_with_history,
        learning_seed,
        local_update,
    )
    from strategies.lbfgs import flat
    from strategies.recovery_replay import RecoveryReplay
    from strategies.replay import ReplaySchedule

    cfg, task, parts = _setup(seed)
    learned, rounds = learn_with_history(cfg, task, parts, seed, per_round=PER_ROUND)
    forget = {min(rounds[0].updates)}
    history = ReferenceHistory(rounds, parts)
    replay = RecoveryReplay(history, 0, forget, rounds[0].start,
                            ReplaySchedule(**cfg.method_settings("SE-R").schedule()))
    state, rows = rounds[0].start, []
    for k in range(1, replay.num_rounds + 1):
        rnd = replay.stored_round(k)
        asked = [c for c, _ in replay.begin(k, state)]
        retained = [c for c, _ in replay.retained(rnd)]
        truth = {c: local_update(cfg, task, state, parts[c], cfg.training.local_epochs,
                                 learning_seed(seed, rnd - 1, c)) for c in retained}
        rows.append(_row(k, replay.is_exact(k), len(asked),
                         {c: flat(u) for c, u in replay.estimates.items()},
                         {c: flat(u) for c, u in truth.items()},
                         {c: flat(history.update(0, rnd, c)) for c in retained}))
        new = replay.finish(k, {c: truth[c] for c in asked})
        state = state if new is None else new
    return {"seed": seed, "forget": sorted(forget), "settings":
            cfg.method_settings("SE-R").schedule(), "rounds": rows,
            "learned_accuracy": _accuracy(cfg, task, learned),
            "recovered_accuracy": _accuracy(cfg, task, state)}


def table() -> str:
    """Markdown: per seed, the estimates' gain and the stored updates' error."""
    lines = ["| seed | estimated updates | gain median | gain < 1 | stored error median "
             "| asked | learned shard | recovered shard |", "|---" * 8 + "|"]
    for path in sorted(HERE.glob("estimator-seed*.json")):
        m = json.loads(path.read_text())
        gains = [g for r in m["rounds"] for g in r["gain"]]
        errors = [e for r in m["rounds"] for e in r["stored_error"]]
        lines.append(
            f"| {m['seed']} | {len(gains)} | {statistics.median(gains):.2f} "
            f"| {sum(g < 1 for g in gains)} | {statistics.median(errors):.2f} "
            f"| {sum(r['asked'] for r in m['rounds'])} "
            f"| {m['learned_accuracy']:.4f} | {m['recovered_accuracy']:.4f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        result = measure(int(sys.argv[1]))
        (HERE / f"estimator-seed{sys.argv[1]}.json").write_text(
            json.dumps(result, indent=1) + "\n")
    print(table())

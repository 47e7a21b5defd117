"""SE-R's recovery round by round: what each shard did and how accurate it was after.

Usage: ``.venv/bin/python docs/results/recovery/trace.py CELL SEED`` reruns the
ablation cell ``CELL`` (``ablation.py``'s ``refillr``: SE-R alone, its defaults) and
writes ``docs/results/recovery/trace-<CELL>-s<SEED>.json``: per impacted shard and
server round k, the stored round it replays, whether it was a planned exact round,
who was asked to train (retained clients with an abnormal estimate, and
substitutes), each retained client's estimate deviation ||U' - U|| / ||U|| (0: the
L-BFGS model had no pair meeting the curvature condition, so U' = U), the norm of
the step W'^k - W'^(k-1), and the shard model's test accuracy after the round.

It observes the run without changing it: ``RecoveryReplay.begin`` / ``finish`` and
the run's ``CentralEvaluator`` are wrapped to read what they compute; the run's
summary (ensemble and shard accuracy) is the same as an untraced run's. Learning's
per-round shard accuracies are kept beside, for the size of an ordinary round's
swing.
"""

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path[:0] = [str(ROOT), str(HERE)]


def _wrap(log: list[dict]) -> None:
    """Wrap RecoveryReplay and CentralEvaluator so each round lands in ``log``."""
    from server_app.evaluation import central
    from strategies import recovery_replay as rr
    from strategies.calibration import difference
    from strategies.lbfgs import flat
    from strategies.sharded import to_record

    evaluators = []
    begin, finish, init = (rr.RecoveryReplay.begin, rr.RecoveryReplay.finish,
                           central.CentralEvaluator.__init__)

    def traced_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        evaluators.append(self)

    def traced_begin(self, k, base):
        ask = begin(self, k, base)
        if 1 <= k <= len(self.plan):
            rnd = self.plan[k - 1]
            dev = {}
            for pid, _ in self.retained(rnd):
                stored = flat(self._stored[pid])
                est = flat(self._estimate(pid, self._stored[pid], self._shift, k))
                dev[pid] = round(float(np.linalg.norm(est - stored)
                                       / np.linalg.norm(stored)), 3)
            log.append({"shard": self.shard, "k": k, "stored_round": rnd,
                        "planned_exact": self.is_exact(k),
                        "asked": sorted(p for p, _ in ask),
                        "substitutes": self.substitutes.get(rnd, []),
                        "estimate_deviation": dev})
        return ask

    def traced_finish(self, k, exact, sizes=None):
        base = self._base
        out = finish(self, k, exact, sizes)
        entry = next((e for e in log if e["shard"] == self.shard and e["k"] == k), None)
        if out is not None and entry is not None:
            entry["step_norm"] = round(float(np.linalg.norm(flat(difference(out, base)))),
                                       3)
            ev = evaluators[-1]
            entry["shard_accuracy"] = round(float(
                ev.task.score(ev.proba(to_record(out)), ev.y)[1]), 4)
        return out

    rr.RecoveryReplay.begin, rr.RecoveryReplay.finish = traced_begin, traced_finish
    central.CentralEvaluator.__init__ = traced_init


def main(cell: str, seed: int) -> dict:
    """The traced run of ``cell`` with ``seed``: its SE-R scores and the round log."""
    import ablation

    from experiments.grid import summary_in_scratch

    log: list[dict] = []
    _wrap(log)
    # SE-R alone with its defaults (refilled slots): the ablation's ``refillr``
    summary = summary_in_scratch(ablation.config("refillr", seed, cell))
    result = summary["frameworks"]["SE-R"]
    return {"cell": cell, "seed": seed, "command": " ".join(["trace.py", cell, str(seed)]),
            "learned_shard_accuracy": summary["learning"]["shard_accuracy"],
            # learning's own round-to-round swings, for comparison
            "learning_shard_accuracy_per_round": [
                r["shard_accuracy"] for r in summary["learning"]["rounds"]],
            "accuracy": result["accuracy"], "shard_accuracy": result["shard_accuracy"],
            "rounds": sorted(log, key=lambda e: (e["shard"], e["k"]))}


if __name__ == "__main__":
    cell, seed = sys.argv[1], int(sys.argv[2])
    out = main(cell, seed)
    (HERE / f"trace-{cell}-s{seed}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}))

"""Mean and spread over seeds of the verification keys of several summary.json files.

usage: python docs/results/verification/collect.py OUT.json SUMMARY.json [...]
Writes, per model (original, FE's own original, each framework), each key's values,
mean and sample standard deviation, and prints a markdown table.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

KEYS = ("accuracy", "backdoor_asr", "backdoor_asr_ensemble", "mia_auc", "mia_f1",
        "mia_tpr_at_1fpr", "client_epochs", "client_rounds", "modelled_wall_s")


def _blocks(summary: dict) -> dict[str, dict]:
    out = {"original": summary["original"]}
    if "backdoor_asr" in summary.get("baseline_learning", {}):
        out["FE original"] = {"backdoor_asr": summary["baseline_learning"]["backdoor_asr"],
                              "accuracy": summary["baseline_learning"]["accuracy"]}
    out.update(summary.get("frameworks", {}))
    return out


def collect(paths: list[str]) -> dict:
    """``{model: {key: {"values", "mean", "std"}}}`` over the summaries in ``paths``."""
    table: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        for model, block in _blocks(json.loads(Path(path).read_text())).items():
            for key in KEYS:
                if key in block:
                    table.setdefault(model, {}).setdefault(key, []).append(block[key])
    return {m: {k: {"values": v, "mean": statistics.fmean(v),
                    "std": statistics.stdev(v) if len(v) > 1 else 0.0}
                for k, v in keys.items()} for m, keys in table.items()}


def markdown(stats: dict) -> str:
    """One row per model, ``mean ± std`` per key."""
    keys = [k for k in KEYS if any(k in v for v in stats.values())]
    lines = ["| model | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for model, values in stats.items():
        cells = [f"{values[k]['mean']:.3f} ± {values[k]['std']:.3f}" if k in values
                 else "" for k in keys]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    result = collect(sys.argv[2:])
    Path(sys.argv[1]).write_text(json.dumps({"runs": sys.argv[2:], "stats": result},
                                            indent=1))
    print(markdown(result))

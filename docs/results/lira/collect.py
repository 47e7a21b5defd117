"""LiRA's numbers of several memorize runs: per seed with intervals, and over seeds.

usage: python docs/results/lira/collect.py OUT.json SUMMARY.json [...]
Writes, per model (original and each framework), each LiRA key's value and 95%
bootstrap interval per run, and the mean and sample standard deviation over the
runs where the value was read; prints markdown tables and the issue's goals.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

KEYS = ("mia_lira_auc", "mia_lira_tpr_at_1fpr", "mia_lira_tpr_at_01fpr",
        "mia_lira_client_auc", "mia_lira_client_tpr_at_1fpr", "mia_ulira_game_auc",
        "mia_ulira_game_tpr_at_1fpr", "mia_ulira_auc", "mia_ulira_tpr_at_1fpr",
        "mia_auc", "mia_tpr_at_1fpr", "accuracy")


def _blocks(summary: dict) -> dict[str, dict]:
    return {"original": summary["original"], **summary.get("frameworks", {})}


def collect(paths: list[str]) -> dict:
    """``{model: {key: {"runs": [[value, ci], ...], "mean", "std"}}}``."""
    table: dict[str, dict[str, list]] = {}
    for path in paths:
        for model, block in _blocks(json.loads(Path(path).read_text())).items():
            for key in KEYS:
                if key in block:
                    table.setdefault(model, {}).setdefault(key, []).append(
                        [block[key], block.get(f"{key}_ci")])
    out: dict = {}
    for model, keys in table.items():
        for key, runs in keys.items():
            read = [v for v, _ in runs if v is not None]
            out.setdefault(model, {})[key] = {
                "runs": runs, "mean": statistics.fmean(read) if read else None,
                "std": statistics.stdev(read) if len(read) > 1 else None}
    return out


def _cell(entry: dict, digits: int = 3) -> str:
    if entry["mean"] is None:
        return "not read"
    spread = f" ± {entry['std']:.{digits}f}" if entry["std"] is not None else ""
    return f"{entry['mean']:.{digits}f}{spread}"


def _run(value, ci) -> str:
    if value is None:
        return "not read"
    return f"{value:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def markdown(stats: dict) -> str:
    """Mean ± std per model, then each run's value [95% interval]."""
    keys = [k for k in KEYS if any(k in v for v in stats.values())]
    lines = ["| model | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for model, values in stats.items():
        lines.append(f"| {model} | " + " | ".join(
            _cell(values[k]) if k in values else "" for k in keys) + " |")
    lines += ["", "| model | key | per run: value [95% bootstrap interval] |",
              "|---|---|---|"]
    for model, values in stats.items():
        for key in keys[:9]:
            if key in values:
                runs = "; ".join(_run(v, ci) for v, ci in values[key]["runs"])
                lines.append(f"| {model} | {key} | {runs} |")
    return "\n".join(lines)


def goals(stats: dict) -> list[str]:
    """The issue's goals, read off the numbers (never tuned to pass)."""
    original, fr = stats.get("original", {}), stats.get("FR", {})
    out = []
    if "mia_lira_tpr_at_1fpr" in original:
        tpr, auc = original["mia_lira_tpr_at_1fpr"], original["mia_lira_auc"]
        out.append(f"original TPR@1%FPR mean {_cell(tpr)} (goal >= 0.10): "
                   f"{'reached' if tpr['mean'] >= 0.10 else 'not reached'}")
        out.append(f"original AUC mean {_cell(auc)} (goal >= 0.70): "
                   f"{'reached' if auc['mean'] >= 0.70 else 'not reached'}")
    if "mia_ulira_auc" in original:
        out.append(f"original, online LiRA against the learned U-LiRA references: AUC "
                   f"{_cell(original['mia_ulira_auc'])}, TPR@1%FPR "
                   f"{_cell(original['mia_ulira_tpr_at_1fpr'])}")
    for name in ("SE", "SE-R", "FE", "FRec"):
        block = stats.get(name, {})
        if "mia_ulira_game_auc" in block:
            out.append(f"U-LiRA, {name} unlearned vs never saw: game AUC mean "
                       f"{_cell(block['mia_ulira_game_auc'])}, TPR@1%FPR "
                       f"{_cell(block['mia_ulira_game_tpr_at_1fpr'])}; the run's model "
                       f"AUC {_cell(block['mia_ulira_auc'])}, TPR@1%FPR "
                       f"{_cell(block['mia_ulira_tpr_at_1fpr'])} (chance: 0.5, 0.01)")
    if "mia_lira_tpr_at_1fpr" in fr:
        inside = [ci is not None and ci[0] <= 0.01 <= ci[1]
                  for _, ci in fr["mia_lira_tpr_at_1fpr"]["runs"]]
        out.append(f"FR TPR@1%FPR interval includes 0.01 in {sum(inside)} of "
                   f"{len(inside)} runs (goal: FR within chance)")
    return out


if __name__ == "__main__":
    result = collect(sys.argv[2:])
    Path(sys.argv[1]).write_text(json.dumps({"runs": sys.argv[2:], "stats": result},
                                            indent=1))
    print(markdown(result))
    print("\n".join(["", *goals(result)]))

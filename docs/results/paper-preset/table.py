"""The "Paper preset on MNIST" tables of docs/RESULTS.md, from the committed files.

Usage (from the project root)::

    python docs/results/paper-preset/table.py

Reads ``iid/summary.json`` and ``noniid/summary.json`` (the two runs of
``run.sh``) and ``machine.json`` (whole-run wall time and peak memory, measured
outside the app by ``run.sh``) in this folder and prints markdown.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTINGS = (("IID", "iid"), ("non-IID", "noniid"))
FRAMEWORKS = ("SE", "FR", "FE", "RR")


def _load(name: str) -> dict:
    return json.loads((HERE / name / "summary.json").read_text())


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(round(seconds % 60))} s"


def overview(runs: dict[str, dict], machine: dict) -> list[str]:
    """One column per setting: time, memory, learning, storage."""
    rows = {
        "wall time, whole run (learning, FE's own unsharded learning, 4 frameworks, "
        "MIA audit)": lambda s, m: _minutes(m["wall_s"]),
        "peak RAM above the idle machine (with the side jobs)": lambda s, m:
            f"{m.get('peak_above_idle_gb_without_side_jobs', m['peak_above_idle_gb']):.1f}"
            f" GB ({m['peak_above_idle_gb']:.1f} GB)",
        "sharded learning: wall / client compute": lambda s, m:
            f"{s['learning']['wall_time_s']:.0f} s / {s['learning']['compute_s']:.0f} s",
        "shard-ensemble test accuracy": lambda s, m: f"{100 * s['learning']['accuracy']:.2f}%",
        "shard models' accuracy": lambda s, m: "{:.2f}-{:.2f}%".format(
            100 * min(s["learning"]["shard_accuracy"]),
            100 * max(s["learning"]["shard_accuracy"])),
        "history per shard server (uncoded SE / FE), MB": lambda s, m: "{:.1f} / {:.1f}".format(
            s["storage"]["SE_uncoded"]["per_server_bytes"] / 1e6,
            s["storage"]["FE"]["per_server_bytes"] / 1e6),
        "history over the system (uncoded SE / FE), MB": lambda s, m: "{:.1f} / {:.1f}".format(
            s["storage"]["SE_uncoded"]["system_bytes"] / 1e6,
            s["storage"]["FE"]["system_bytes"] / 1e6),
        "server files after pruning (uncoded SE / FE), MB": lambda s, m: "{:.1f} / {:.1f}".format(
            s["storage"]["SE_uncoded"]["server_bytes"] / 1e6,
            s["storage"]["FE"]["server_bytes"] / 1e6),
    }
    names = [label for label, key in SETTINGS if key in runs]
    out = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, cell in rows.items():
        out.append(f"| {label} | " + " | ".join(
            cell(runs[key], machine[key]) for _, key in SETTINGS if key in runs) + " |")
    return out


def _rounds(f: dict) -> str:
    if "rounds_replayed" in f:
        return f"{f['rounds_replayed']} replayed"
    if f.get("rounds_to_target") is not None:
        return f"{f['rounds_to_target']} to target"
    return ""


def frameworks(label: str, s: dict) -> list[str]:
    """Accuracy, loss, cost and MIA of the original model and each framework."""
    o = s["original"]
    out = [f"| {label} | accuracy | loss | compute s | modelled wall s | client-epochs "
           "| rounds | comm s | MIA F1 |", "|---|" + "---|" * 8,
           f"| original | {100 * o['accuracy']:.2f} | {o['loss']:.4f} | | | | | | "
           f"{o.get('mia_f1', float('nan')):.3f} |"]
    for name in FRAMEWORKS:
        f = s["frameworks"].get(name)
        if f is None:
            continue
        out.append(
            f"| {name} | {100 * f['accuracy']:.2f} | {f['loss']:.4f} | "
            f"{f['retrain_compute_s']:.0f} | {f['modelled_wall_s']:.0f} | "
            f"{f['client_epochs']:.0f} | {_rounds(f)} | {f['comm_time_s']:.1f} | "
            f"{f.get('mia_f1', float('nan')):.3f} |")
    return out


def ratios(label: str, s: dict) -> str:
    """SE against FR: compute, modelled wall, accuracy points."""
    se, fr = s["frameworks"]["SE"], s["frameworks"]["FR"]
    gap = 100 * (fr["accuracy"] - se["accuracy"])
    return (f"- {label}: SE/FR compute {se['retrain_compute_s'] / fr['retrain_compute_s']:.3f},"
            f" modelled wall {se['modelled_wall_s'] / fr['modelled_wall_s']:.3f},"
            f" client-epochs {se['client_epochs'] / fr['client_epochs']:.3f}; SE "
            f"{abs(gap):.2f} points {'below' if gap >= 0 else 'above'} FR's accuracy")


def main() -> None:
    """Print the tables."""
    runs = {key: _load(key) for _, key in SETTINGS if (HERE / key / "summary.json").exists()}
    machine = json.loads((HERE / "machine.json").read_text())
    lines = overview(runs, machine) + [""]
    for label, key in SETTINGS:
        if key in runs:
            lines += frameworks(label, runs[key]) + [""]
    lines += [ratios(label, runs[key]) for label, key in SETTINGS if key in runs]
    print("\n".join(lines))


if __name__ == "__main__":
    main()

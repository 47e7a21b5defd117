"""Every framework beside FR, one table over several suite runs (issue 26, item 4).

Usage: ``.venv/bin/python docs/results/side-by-side/overview.py`` reads the
``results.csv`` of every folder here (each the output of one
``./simulate.sh experiments ...`` command, named in this folder's README) and writes
``overview.md``: per run that has FR, every framework's headline score (accuracy;
Tiny Shakespeare: test loss, nats per character), its difference from FR's, the
retrained shards' own accuracy beside the original's same shards' (SE and SE-R: the
ensemble can hide a broken shard), client compute and modelled wall time over FR's,
client-epochs and client rounds; then, per cell, whether SE and SE-R are within
issue 26's margins of FR (1.0 accuracy point, 0.03 nats). Every score is measured
on the run's test set; wall times are modelled from measured training seconds.
Sequential runs and FE at interval 2 are left out (they have no FR).
"""

import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = ("original", "SE", "SE-R", "FR", "FRec", "FE", "RR")
MARGIN = {"accuracy": 1.0, "loss": 0.03}  # points; nats


def _float(value: str) -> float | None:
    return float(value) if value not in ("", None) else None


def runs(folders: list[Path]) -> dict[str, dict[str, dict]]:
    """``{folder/run: {framework: row}}`` of every run with FR, in the folders' order.

    Keyed by folder too: a cell rerun under newer defaults keeps its run name.
    """
    out: dict[str, dict[str, dict]] = {}
    for folder in folders:
        with open(folder / "results.csv") as f:
            for row in csv.DictReader(f):
                out.setdefault(f"{folder.name}/{row['run']}", {})[row["framework"]] = row
    return {run: fw for run, fw in out.items() if "FR" in fw}


def _cell(row: dict) -> str:
    if row["experiment"] == "concurrent":
        return (f"{row['dataset']} {row['request_distribution']} K={row['num_requests']}"
                f" (C={row['num_clients']})")
    return f"{row['dataset']} {row['partition']} one request (C={row['num_clients']})"


def _gap(row: dict, fr: dict, metric: str) -> float | None:
    """Difference from FR: accuracy points, or nats of test loss (lower is better)."""
    mine, ref = _float(row[metric]), _float(fr[metric])
    if mine is None or ref is None:
        return None
    return 100 * (mine - ref) if metric == "accuracy" else mine - ref


def _ratio(row: dict, fr: dict, key: str) -> str:
    mine, ref = _float(row.get(key, "")), _float(fr.get(key, ""))
    return f"{mine / ref:.2f}" if mine is not None and ref else ""


def _shards(row: dict) -> str:
    mine = _float(row.get("impacted_shard_accuracy", ""))
    if mine is None:
        return ""
    before = _float(row.get("impacted_shard_accuracy_original", ""))
    return f"{mine:.4f} ({before:.4f})" if before is not None else f"{mine:.4f}"


def _se_rule(row: dict) -> str:
    """Which SE ran: the paper's, or with n exact final rounds and refilled slots.

    Runs made before the ``calibration-final`` and ``replay-refill`` keys existed
    have neither: the paper's. Their columns were renamed with the keys
    (``method.se.*``); older files have the first names.
    """
    final = int(row.get("method.se.calibration-final") or row.get("calibration_final") or 0)
    refill = str(row.get("method.se.replay-refill", row.get("replay_refill", ""))
                 ).lower() in ("true", "1")
    if not final and not refill:
        return "paper's SE"
    parts = [f"{final} exact final round(s)"] if final else []
    return "SE, " + ", ".join(parts + (["refilled slots"] if refill else []))


def _ser_rule(row: dict) -> str:
    """Whether SE-R refilled forgotten slots (runs before ``recovery-refill``: no)."""
    refill = str(row.get("method.se-r.refill", row.get("recovery_refill", ""))
                 ).lower() in ("true", "1")
    return "refilled slots" if refill else "no refill"


def table(fw: dict[str, dict]) -> list[str]:
    """One run's frameworks beside FR, markdown rows."""
    fr = fw["FR"]
    metric = fr["metric"]
    unit = "points" if metric == "accuracy" else "nats"
    lines = [f"| model | {metric} | - FR ({unit}) | retrained shards' accuracy "
             "(original's) | compute / FR | modelled wall / FR | client-epochs "
             "| client rounds |", "|---" * 8 + "|"]
    for name in [n for n in ORDER if n in fw] + sorted(set(fw) - set(ORDER)):
        row = fw[name]
        gap = _gap(row, fr, metric) if name != "FR" else None
        lines.append(
            f"| {name} | {_float(row[metric]):.4f} | "
            f"{'' if gap is None else f'{gap:+.2f}'} | {_shards(row)} | "
            f"{_ratio(row, fr, 'retrain_compute_s')} | "
            f"{_ratio(row, fr, 'modelled_wall_s')} | {row['client_epochs']} | "
            f"{row['client_rounds']} |")
    return lines


def verdicts(all_runs: dict[str, dict[str, dict]]) -> list[str]:
    """Per cell: SE's and SE-R's difference from FR against issue 26's margins."""
    lines = ["| cell | seed | SE rule | SE - FR | within | SE-R rule | SE-R - FR "
             "| within |", "|---" * 8 + "|"]
    for fw in all_runs.values():
        fr = fw["FR"]
        metric = fr["metric"]
        cells = []
        for name, rule in (("SE", _se_rule(fr)), ("SE-R", _ser_rule(fr))):
            cells.append(rule)
            gap = _gap(fw[name], fr, metric) if name in fw else None
            ok = None if gap is None else (
                gap >= -MARGIN[metric] if metric == "accuracy" else gap <= MARGIN[metric])
            cells += ["" if gap is None else f"{gap:+.2f}",
                      {None: "", True: "yes", False: "no"}[ok]]
        lines.append(f"| {_cell(fr)} | {fr['seed']} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str]) -> int:
    """Write overview.md from the folders named (default: every folder here)."""
    folders = [Path(a) for a in argv] or sorted(
        p for p in HERE.iterdir() if (p / "results.csv").is_file())
    all_runs = runs(folders)
    out = ["# Every framework beside FR", "",
           f"Made by `overview.py` from {', '.join(f'`{p.name}/`' for p in folders)}. "
           "Scores measured on each run's test set; wall times modelled from "
           "measured training seconds; one seed per run unless a cell repeats.", "",
           "## SE and SE-R against issue 26's margins (1.0 point; 0.03 nats)", "",
           "Image tasks: accuracy points; Tiny Shakespeare: test loss in nats "
           "(lower is better: within means at most 0.03 above FR's).", "",
           *verdicts(all_runs), ""]
    for run, fw in all_runs.items():
        out += [f"## {_cell(fw['FR'])}, seed {fw['FR']['seed']}", "",
                f"Run `{run}`; SE is the {_se_rule(fw['FR'])}.", "",
                *table(fw), ""]
    (HERE / "overview.md").write_text("\n".join(out))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

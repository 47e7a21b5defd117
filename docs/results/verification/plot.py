"""Figure of the verification presets: backdoor ASR and MIA AUC per model, mean ± std.

usage: python docs/results/verification/plot.py VERIFY_STATS.json MEMORIZE_STATS.json \
    OUT.png [CLEAN_STATS.json]
The stats files are written by ``collect.py``. The optional clean-reference stats
(the verify preset with ``backdoor-fraction=0.0``) draw the clean model's ASR as a line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODELS = ("original", "SE", "FR", "FE", "RR")


def _bars(ax, stats: dict, key: str, title: str) -> None:
    """One bar per model (mean), error bar the sample std, dots the seeds."""
    names = [m for m in MODELS if key in stats.get(m, {})]
    means = [stats[m][key]["mean"] for m in names]
    stds = [stats[m][key]["std"] for m in names]
    ax.bar(names, means, yerr=stds, capsize=4, color="#8fb3d9", edgecolor="#2b5d8a")
    for i, m in enumerate(names):
        values = stats[m][key]["values"]
        ax.plot([i] * len(values), values, "k.", markersize=4)
    ax.set_title(title)
    ax.set_ylim(0, 1)


def main(verify: str, memorize: str, out: str, clean: str | None = None) -> None:
    """Write the two-panel figure to ``out``."""
    v = json.loads(Path(verify).read_text())["stats"]
    m = json.loads(Path(memorize).read_text())["stats"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    _bars(left, v, "backdoor_asr", "backdoor ASR (verify; sharded: impacted shard)")
    if clean:
        base = json.loads(Path(clean).read_text())["stats"]["original"]["backdoor_asr"]
        left.axhline(base["mean"], color="grey", ls="--", lw=1, label="clean original")
        left.axhline(0.80, color="green", ls=":", lw=1, label="goal for the original")
        left.legend(fontsize=7, loc="upper right")
    _bars(right, m, "mia_auc", "shadow-model MIA AUC (memorize)")
    right.axhline(0.5, color="grey", ls="--", lw=1, label="chance")
    right.axhline(0.60, color="green", ls=":", lw=1, label="goal for the original")
    right.axhline(0.55, color="red", ls=":", lw=1, label="goal for FR (at most)")
    right.legend(fontsize=7, loc="upper right")
    fig.suptitle("Forgetting verified: mean ± std over seeds 0-2 (dots: seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    main(*sys.argv[1:])

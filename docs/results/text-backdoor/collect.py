"""The text backdoor's table: per model, mean ± sample std over seeds and each seed.

usage: python docs/results/text-backdoor/collect.py OUT.json FOLDER
FOLDER holds ``verify-text-seed<S>.json`` (presets/verify-text.toml) and
``verify-text-clean-seed<S>.json`` (the same with backdoor-fraction=0.0, SE only).
Writes the numbers to OUT.json and prints a markdown table and the issue's goals:
original ASR >= 0.8; FR and SE at most 0.05 above the clean model's ASR. Loss and
accuracy are the shard ensemble's (FR: its one model); ``backdoor_asr`` is the
impacted shard's model's (FR: its one model), ``backdoor_asr_ensemble`` the
ensemble's.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

KEYS = ("loss", "accuracy", "backdoor_asr", "backdoor_asr_ensemble")


def rows(folder: Path) -> dict[str, dict[str, list[float]]]:
    """``{model: {key: [value per seed]}}`` for original, clean original, SE, FR."""
    out: dict[str, dict[str, list[float]]] = {}
    seeds = sorted(int(p.stem.rsplit("seed", 1)[1])
                   for p in folder.glob("verify-text-seed*.json"))
    for seed in seeds:
        main = json.loads((folder / f"verify-text-seed{seed}.json").read_text())
        clean = json.loads((folder / f"verify-text-clean-seed{seed}.json").read_text())
        blocks = {"original": main["original"],
                  "clean original": clean["original"],
                  "SE": main["frameworks"]["SE"],
                  "FR": main["frameworks"]["FR"]}
        for model, block in blocks.items():
            for key in KEYS:
                if block.get(key) is not None:
                    out.setdefault(model, {}).setdefault(key, []).append(block[key])
    return out


def cell(values: list[float]) -> str:
    """``mean ± std`` (sample std; 0 for one seed)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {std:.3f}"


def main(out: Path, folder: Path) -> None:
    """Write ``out`` and print the table and the goals."""
    table = rows(folder)
    out.write_text(json.dumps(table, indent=1) + "\n")
    print("| model | test loss (nats/char) | next-char accuracy | backdoor ASR | "
          "ASR of the ensemble | ASR per seed |")
    print("|---|---|---|---|---|---|")
    for model, keys in table.items():
        cells = [cell(keys[k]) if k in keys else "" for k in KEYS]
        seeds = ", ".join(f"{v:.3f}" for v in keys["backdoor_asr"])
        print(f"| {model} | " + " | ".join(cells) + f" | {seeds} |")
    asr = {m: statistics.fmean(k["backdoor_asr"]) for m, k in table.items()}
    clean = asr["clean original"]
    print(f"\ngoal original ASR >= 0.8: {asr['original']:.3f} "
          f"(min over seeds {min(table['original']['backdoor_asr']):.3f})")
    for model in ("FR", "SE"):
        print(f"goal {model} <= clean + 0.05: {asr[model]:.3f} vs clean {clean:.3f} "
              f"(difference {asr[model] - clean:+.3f})")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

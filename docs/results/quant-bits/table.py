"""The sweep's table: SE's accuracy and its retrained shard's, by quant-scale-bits."""

import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
uncoded = json.loads((out / "quncoded" / "summary.json").read_text())
impacted = uncoded["frameworks"]["SE"]["requests"][0]["impacted_shards"][0]
base = uncoded["frameworks"]["SE"]["shard_accuracy"][impacted]
print(f"{'storage':<14}{'SE ensemble':>12}{'retrained shard':>17}{'vs uncoded':>12}")
for name in ("uncoded", "1", "4", "8", "12", "16", "20", "24"):
    summary = json.loads((out / f"q{name}" / "summary.json").read_text())
    se = summary["frameworks"]["SE"]
    shard = se["shard_accuracy"][impacted]
    label = "uncoded" if name == "uncoded" else f"coded, b={name}"
    print(f"{label:<14}{se['accuracy']:>12.3f}{shard:>17.3f}{shard - base:>+12.3f}")

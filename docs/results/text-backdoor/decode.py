"""What each shard model of a verify-text run decodes after the phrase (most common).

usage: python docs/results/text-backdoor/decode.py SEED RUN_FOLDER MODELS...
MODELS: names under RUN_FOLDER/models (v1 = the original, SE, FR). Prints, per shard
model, the four most common greedy 3-character continuations of the 500 test
contexts ending in the phrase (presets/verify-text.toml with seed SEED).
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

from flwr.app import Array, ArrayRecord

from audits.backdoor import TextBackdoorProbe
from cli.config import preset_values
from history.files import read_arrays
from server_app.config import RunConfig
from server_app.stages.audit import audited_run
from task.builtin import SHAKESPEARE_VOCAB
from task.config import fused_run_config
from task.registry import load_data
from task.text import decode
from task.text_backdoor import greedy_continuations


def main(seed: int, folder: Path, names: list[str]) -> None:
    """Print the most common continuations of each shard model of each ``names``."""
    root = Path(__file__).resolve().parents[3]
    preset = preset_values("verify-text")
    data_dir = os.environ.get("SE_DATA_DIR", str(root.parent / "shared" / "data"))
    cfg = RunConfig.from_run_config(fused_run_config(
        {**preset, "seed": seed, "data-dir": data_dir}))
    probe = TextBackdoorProbe(audited_run(cfg),
                              load_data(cfg.task(), cfg.task_settings(), data_dir),
                              cfg.as_dict())
    for name in names:
        arrays = read_arrays(folder / "models" / f"{name}.npz")
        for shard in sorted({k.split("/")[0] for k in arrays}):
            record = ArrayRecord({k.split("/", 1)[1]: Array(v) for k, v in arrays.items()
                                  if k.startswith(shard + "/")})
            asr = probe.scores([record], [list(probe.backdoor.clients)])["backdoor_asr"]
            model = cfg.task().model(65)
            model.load_state_dict(record.to_torch_state_dict())
            decoded = greedy_continuations([lambda x, m=model: cfg.task().predict(m, x)],
                                           probe.contexts, 3)
            common = Counter(decode(r, SHAKESPEARE_VOCAB) for r in decoded)
            print(f"{name} {shard}: ASR {asr:.3f}, most common {common.most_common(4)}")


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:])

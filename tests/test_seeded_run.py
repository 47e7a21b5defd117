"""The seeded in-process run: its results are pinned, so a refactor cannot move them.

The restructure (task/, history/, one round loop, typed results) kept these numbers
bit for bit; the model hashes were compared with the same run on the code before it
(the commands are in the closing notes). Here accuracies are pinned to 1e-6 and test
losses to a relative 1e-4, which a single changed training step, sample or aggregation
weight moves by far more, and the counts exactly. The loss tolerance is wider because
the CPU's float kernels differ between hosts: the same commit gave FE a loss of
2.1893651 on one host and 2.1893778 on another (the accuracies equal). A deliberate
behaviour change updates ``tests/data/seeded_run.json`` and says why in its commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

PINNED = json.loads((Path(__file__).parent / "data" / "seeded_run.json").read_text())
# the paper's SE (calibration-final = 0, replay-refill = false), pinned before the
# exact final round and the refilled slots became SE's default; "default" pins SE as
# shipped since (its replayed round 2 exact, forgotten slots refilled)
PAPER = {"method.se.calibration-final": 0, "method.se.replay-refill": False}
# "uncoded" keeps the frameworks it was pinned with (SISA joined the defaults later)
RUNS = {"uncoded": {"mia": False, "forget-clients": "3", "frameworks": "SE,FR,FE,RR",
                    **PAPER},
        "coded": {"mia": False, "forget-clients": "3", "storage": "coded",
                  "blocks-per-shard": 2, "frameworks": "SE", **PAPER},
        "default": {"mia": False, "forget-clients": "3", "frameworks": "SE"}}


def _numbers(summary: dict) -> dict:
    learning = summary["learning"]
    out = {"learning": [learning["accuracy"], learning["loss"], learning["client_epochs"],
                        [r["participants"] for r in learning["rounds"]]]}
    for name, result in sorted(summary.get("frameworks", {}).items()):
        out[name] = [result["accuracy"], result["loss"], result["client_epochs"],
                     result["requests"][0]["impacted_shards"]]
    return out


@pytest.mark.parametrize("storage", sorted(RUNS))
def test_seeded_in_process_run_gives_the_pinned_results(run_server, storage):
    summary, _ = run_server(RUNS[storage])
    got, want = _numbers(summary), PINNED[storage]
    assert sorted(got) == sorted(want)
    for name, (accuracy, loss, epochs, counts) in want.items():
        assert got[name][0] == pytest.approx(accuracy, abs=1e-6), name
        assert got[name][1] == pytest.approx(loss, rel=1e-4), name
        assert got[name][2] == epochs and got[name][3] == counts, name

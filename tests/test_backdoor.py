"""Backdoor verification (issue 13): poisoning in task/, ASR in summary.json."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cli.report import render
from server_app.config import ConfigError, RunConfig
from task.backdoor import Backdoor, attack_success_rate, poison, stamp, triggered_test_set
from task.config import fused_run_config

ON = {"backdoor-trigger": 3, "backdoor-fraction": 0.5, "backdoor-target": 7,
      "forget-clients": "3"}


def _images(n=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 200, (n, 1, 28, 28), dtype=torch.uint8, generator=g)
    return x, torch.arange(n, dtype=torch.int64) % 10


def test_stamp_sets_the_corner_square_only_and_copies():
    x, _ = _images()
    out = stamp(x, 3)
    assert torch.all(out[..., -3:, -3:] == 255)
    assert torch.equal(out[..., :-3, :], x[..., :-3, :])
    assert torch.equal(out[..., :, :-3], x[..., :, :-3])
    assert not torch.all(x[..., -3:, -3:] == 255)  # input untouched
    with pytest.raises(ValueError, match="trigger"):
        stamp(x, 29)
    with pytest.raises(ValueError, match="uint8"):
        stamp(x.float(), 3)


def test_only_the_forgotten_clients_poison_their_share_deterministically():
    backdoor = Backdoor.from_run_config(fused_run_config(ON))
    assert backdoor.clients == (3,) and backdoor.poisons(3) and not backdoor.poisons(4)
    x, y = _images()
    x1, y1, n1 = poison(x, y, backdoor, seed=0, partition_id=3)
    x2, y2, n2 = poison(x, y, backdoor, seed=0, partition_id=3)
    assert n1 == n2 == 10 and torch.equal(x1, x2) and torch.equal(y1, y2)
    changed = torch.any((x1 != x).flatten(1), dim=1) | (y1 != y)
    assert int(changed.sum()) <= 10
    stamped = torch.all(x1[..., -3:, -3:].flatten(1) == 255, dim=1)
    assert int(stamped.sum()) == 10 and torch.all(y1[stamped] == 7)
    clean = poison(x, y, backdoor, seed=0, partition_id=4)
    assert clean[0] is x and clean[2] == 0
    off = Backdoor.from_run_config(fused_run_config({"forget-clients": "3"}))
    assert not off.enabled and not off.poisons(3)


def test_asr_counts_target_predictions_on_other_classes():
    x, y = _images()
    backdoor = Backdoor(3, 0.5, 7, (3,))
    test = triggered_test_set(x, y, backdoor)
    assert len(test) == int((y != 7).sum())
    proba = np.eye(10)[[7, 7, 1, 2]]
    assert attack_success_rate(proba, 7) == 0.5


@pytest.mark.parametrize("overrides, key", [
    ({"backdoor-trigger": 3}, "backdoor-trigger"),                      # no forget-clients
    ({**ON, "dataset": "shakespeare"}, "backdoor-trigger"),
    ({**ON, "backdoor-trigger": 9}, "backdoor-trigger"),
    ({**ON, "backdoor-fraction": 1.5}, "backdoor-fraction"),
    ({**ON, "backdoor-fraction": float("nan")}, "backdoor-fraction"),
    ({**ON, "backdoor-target": 10}, "backdoor-target"),
])
def test_bad_backdoor_settings_are_refused_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        RunConfig.from_run_config(fused_run_config(overrides))


def test_run_reports_the_asr_of_every_model_and_forgetting_removes_it(run_server):
    # every client every round, client 3 all poisoned: its shard learns the trigger
    summary, _ = run_server({**ON, "backdoor-fraction": 1.0, "backdoor-target": 0,
                             "clients-per-round": 8, "num-rounds": 3,
                             "local-epochs": 3, "mia": False, "frameworks": "SE,FR"})
    original, frameworks = summary["original"], summary["frameworks"]
    for block in (original, frameworks["SE"], frameworks["FR"]):
        assert 0.0 <= block["backdoor_asr"] <= 1.0
    assert "backdoor_asr_ensemble" in original and "backdoor_asr_ensemble" in \
        frameworks["SE"] and "backdoor_asr_ensemble" not in frameworks["FR"]
    verification = summary["verification"]
    assert verification["backdoor"]["poisoned_clients"] == [3]
    assert verification["forgotten_rounds"] == {"3": 3}
    assert original["backdoor_asr"] > 0.5
    assert frameworks["FR"]["backdoor_asr"] < 0.2
    assert frameworks["SE"]["backdoor_asr"] < 0.2
    text = render(summary)
    assert "backdoor ASR" in text and "ASR ensemble" in text and "client 3: 3" in text

"""The presets of issue 13: valid; verify's poisoned clients share a shard."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from server_app.config import RunConfig
from server_app.rounds.federation import assign_shards
from task.config import fused_run_config

PRESETS = Path(__file__).resolve().parents[1] / "presets"


def _cfg(name: str, **overrides) -> RunConfig:
    preset = tomllib.loads((PRESETS / f"{name}.toml").read_text())
    return RunConfig.from_run_config(fused_run_config({**preset, **overrides}))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_verify_forgets_poisoned_clients_of_one_shard(seed):
    cfg = _cfg("verify", seed=seed)
    poisoned = {int(p) for p in cfg.unlearning.forget_clients.split(",")}
    assert len(poisoned) >= 2 and cfg.audit.backdoor_trigger > 0 and not cfg.audit.mia
    shards = assign_shards(cfg.data.num_clients, cfg.training.num_shards, seed)
    assert any(poisoned <= set(s) for s in shards), shards
    # they train in every round
    assert cfg.training.clients_per_round == cfg.data.num_clients


def test_memorize_has_free_training_images_for_non_members_and_shadows():
    cfg = _cfg("memorize")
    forgotten = cfg.unlearning.forget_clients.split(",")
    assert cfg.audit.mia and cfg.audit.mia_shadows >= 1 and cfg.data.client_samples > 0
    assert len(forgotten) * cfg.data.client_samples >= 200  # targets for a usable AUC


def test_memorize_records_scores_erased_records_of_clients_that_stay():
    """Issue 45: 100 erased records, the owners keep half; shadows and LiRA on."""
    cfg = _cfg("memorize-records")
    cfg.validate()
    records = cfg.unlearning.erased_records
    assert sum(map(len, records.values())) >= 100 and not cfg.unlearning.forget_clients
    assert all(0 < len(ids) < cfg.data.client_samples for ids in records.values())
    assert cfg.audit.mia and cfg.audit.mia_shadows >= 1 and cfg.audit.mia_references >= 2
    assert cfg.audit.mia_unlearn_references == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_verify_records_erases_poisoned_records_of_one_shard(seed):
    """Issue 45: the poisoned images are the erased records; their clients stay."""
    cfg = _cfg("verify-records", seed=seed)
    cfg.validate()
    owners = set(cfg.unlearning.erased_records)
    assert len(owners) >= 2 and cfg.audit.backdoor_trigger > 0
    assert not cfg.unlearning.forget_clients
    shards = assign_shards(cfg.data.num_clients, cfg.training.num_shards, seed)
    assert any(owners <= set(s) for s in shards), shards
    for ids in cfg.unlearning.erased_records.values():
        assert 0 < len(ids) < cfg.data.client_samples  # each owner keeps clean records


def test_a_records_backdoor_stamps_exactly_the_erased_records():
    import torch

    from task.backdoor import Backdoor, poison

    backdoor = Backdoor.from_run_config(fused_run_config(
        {"backdoor-trigger": 2, "backdoor-target": 0, "forget-records": "1:0,2"}))
    x = torch.zeros((4, 1, 6, 6), dtype=torch.uint8)
    y = torch.tensor([3, 4, 5, 6])
    px, py, count = poison(x, y, backdoor, seed=0, partition_id=1)
    assert count == 2 and py.tolist() == [0, 4, 0, 6]
    assert [bool(px[i].any()) for i in range(4)] == [True, False, True, False]
    assert poison(x, y, backdoor, seed=0, partition_id=0)[2] == 0  # not an owner

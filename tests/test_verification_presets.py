"""The presets of issue 13: valid; verify's poisoned clients share a shard."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from server_app.config.run_config import RunConfig
from server_app.rounds.federation import assign_shards
from task.config import fused_run_config

PRESETS = Path(__file__).resolve().parents[1] / "presets"


def _cfg(name: str, **overrides) -> RunConfig:
    preset = tomllib.loads((PRESETS / f"{name}.toml").read_text())
    return RunConfig.from_run_config(fused_run_config({**preset, **overrides}))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_verify_forgets_poisoned_clients_of_one_shard(seed):
    cfg = _cfg("verify", seed=seed)
    poisoned = {int(p) for p in cfg.forget_clients.split(",")}
    assert len(poisoned) >= 2 and cfg.backdoor_trigger > 0 and not cfg.mia
    shards = assign_shards(cfg.num_clients, cfg.num_shards, seed)
    assert any(poisoned <= set(s) for s in shards), shards
    assert cfg.clients_per_round == cfg.num_clients  # they train in every round


def test_memorize_has_free_training_images_for_non_members_and_shadows():
    cfg = _cfg("memorize")
    forgotten = cfg.forget_clients.split(",")
    assert cfg.mia and cfg.mia_shadows >= 1 and cfg.client_samples > 0
    assert len(forgotten) * cfg.client_samples >= 200  # targets for a usable AUC

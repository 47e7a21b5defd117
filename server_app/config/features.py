"""Checks of the run config's feature groups: coded storage, backdoor and shadow MIA.

Each takes a :class:`server_app.config.run_config.RunConfig` and raises
:class:`~server_app.config.values.ConfigError` naming the key, the value and what
is allowed.
"""

from __future__ import annotations

import math

from server_app.config.values import bad
from task.backdoor import MAX_TRIGGER

STORAGE_MODES = ("uncoded", "coded")


def check_storage(cfg) -> None:
    """``storage``, ``blocks-per-shard``, ``quant-scale-bits``, ``privacy-t``, budget."""
    if cfg.storage not in STORAGE_MODES:
        raise bad("storage", cfg.storage, f"one of {', '.join(STORAGE_MODES)}")
    if cfg.blocks_per_shard < 0:
        raise bad("blocks-per-shard", cfg.blocks_per_shard,
                  "0 (chosen from num-clients) or a positive integer")
    if not 1 <= cfg.quant_scale_bits <= 30:
        raise bad("quant-scale-bits", cfg.quant_scale_bits,
                  "an integer in [1, 30] (fractional bits of the fixed point)")
    if cfg.privacy_t < 0:
        raise bad("privacy-t", cfg.privacy_t,
                  "an integer >= 0 (colluding clients that learn nothing)")
    if not (math.isfinite(cfg.coded_loss_budget) and
            0 <= cfg.coded_loss_budget < 1):
        raise bad("coded-loss-budget", cfg.coded_loss_budget,
                  "a number in [0, 1) (fraction of slices that may be lost)")
    if cfg.storage == "coded":
        check_code_size(cfg)


def check_code_size(cfg) -> None:
    """K >= 1 and K + T <= C: every shard's round decodes from K + T slices."""
    k, t, c = cfg.coded_blocks_per_shard, cfg.privacy_t, cfg.num_clients
    if cfg.blocks_per_shard == 0 and k < 1:
        raise bad("coded-loss-budget", cfg.coded_loss_budget,
                  f"a budget that leaves data blocks with storage='coded': "
                  f"floor((1 - budget) x num-clients = {c}) - privacy-t = {t} "
                  f"= {k} blocks a shard; lower it or privacy-t")
    if k + t > c:  # explicit K only: a chosen K + T is at most floor((1 - f) C)
        raise bad("blocks-per-shard", cfg.blocks_per_shard,
                  f"at most num-clients - privacy-t = {c - t} blocks a shard with "
                  f"storage='coded': each shard's round decodes from "
                  f"blocks-per-shard + privacy-t = {k + t} slices, one a client")


def check_backdoor(cfg) -> None:
    """``backdoor-*`` and ``mia-shadows``: ranges, images only, forget-clients."""
    if not 0 <= cfg.backdoor_trigger <= MAX_TRIGGER:
        raise bad("backdoor-trigger", cfg.backdoor_trigger,
                  f"0 (off) or a square side in pixels, 1..{MAX_TRIGGER}")
    if not 0.0 <= cfg.backdoor_fraction <= 1.0:
        raise bad("backdoor-fraction", cfg.backdoor_fraction,
                  "a share of a poisoned client's images in [0, 1]")
    if not 0 <= cfg.backdoor_target <= 9:
        raise bad("backdoor-target", cfg.backdoor_target,
                  "a class index in 0..9")
    if not 0 <= cfg.mia_shadows <= 32:
        raise bad("mia-shadows", cfg.mia_shadows,
                  "0 (attack fit on the original model) or 1..32 shadow models")
    if cfg.mia_shadows and (cfg.dataset == "shakespeare" or not cfg.mia):
        raise bad("mia-shadows", cfg.mia_shadows,
                  "0 unless mia = true and the dataset has classes (images)")
    if cfg.backdoor_trigger == 0:
        return
    if cfg.dataset == "shakespeare":
        raise bad("backdoor-trigger", cfg.backdoor_trigger,
                  "0 with dataset='shakespeare' (image datasets only)")
    if not cfg.forget_client_list:
        raise bad("backdoor-trigger", cfg.backdoor_trigger,
                  "0 unless forget-clients names the poisoned clients (the "
                  "clients of the one unlearning request)")

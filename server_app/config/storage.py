"""Run-config section ``storage``: where the training history lives, and its code.

``storage = "coded"`` spreads the history over the clients as Lagrange-coded slices
over GF(2^31 - 1) (paper Sec. 3.3); the other keys size that code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from history.coded.catalog import auto_blocks_per_shard
from server_app.config.values import bad
from task.section import Section

STORAGE_MODES = ("uncoded", "coded")



MIN_SCALE_BITS = 16
"""The fewest fractional bits a coded history may keep: a step of 2^-16. Coarser
steps move what a replay reads away from the uncoded history's
(``docs/results/quant-bits``: on a tiny MNIST run a retrained shard reached 0.134
with 1 bit against 0.348 uncoded, and was within 0.002 of it at 16 bits)."""

@dataclass(frozen=True)
class StorageConfig(Section):
    """The history's storage (keys ``storage``, ``blocks-per-shard`` ...).

    Attributes
    ----------
    mode : str
        Run-config ``storage``: ``uncoded`` (the servers keep every blob) or
        ``coded`` (clients keep coded slices, the servers keys and metadata).
    blocks_per_shard : int
        K data blocks a shard (0: chosen from C, :attr:`coded_blocks_per_shard`).
    quant_scale_bits : int
        Fractional bits of the fixed point in GF(2^31 - 1).
    privacy_t : int
        T colluding clients that learn nothing (random padding blocks).
    coded_loss_budget : float
        Fraction of a round's slices that may be lost (sizes K when it is 0).
    node_dirs : str
        Simulated clients' node folders (client p: ``<node-dirs>/<p>``), where
        their coded slices outlive the run; '' = in memory only.
    """

    mode: str = field(default="uncoded", metadata={"key": "storage"})
    blocks_per_shard: int = 0
    quant_scale_bits: int = 24
    privacy_t: int = 0
    coded_loss_budget: float = 0.5
    node_dirs: str = ""

    @property
    def coded(self) -> bool:
        """Whether the history is coded into client slices."""
        return self.mode == "coded"

    def validate(self, num_clients: int) -> None:
        """Raise :class:`ConfigError` on the first bad value; C sizes the code."""
        if self.mode not in STORAGE_MODES:
            raise bad("storage", self.mode, f"one of {', '.join(STORAGE_MODES)}")
        if self.blocks_per_shard < 0:
            raise bad("blocks-per-shard", self.blocks_per_shard,
                      "0 (chosen from num-clients) or a positive integer")
        self.check_bounds()
        if not MIN_SCALE_BITS <= self.quant_scale_bits <= 30:
            raise bad("quant-scale-bits", self.quant_scale_bits,
                      f"an integer in [{MIN_SCALE_BITS}, 30] (fractional bits of the "
                      "fixed point; fewer round the stored updates visibly)")
        if self.privacy_t < 0:
            raise bad("privacy-t", self.privacy_t,
                      "an integer >= 0 (colluding clients that learn nothing)")
        if not (math.isfinite(self.coded_loss_budget) and
                0 <= self.coded_loss_budget < 1):
            raise bad("coded-loss-budget", self.coded_loss_budget,
                      "a number in [0, 1) (fraction of slices that may be lost)")
        if self.coded:
            self._validate_code_size(num_clients)

    def blocks(self, num_clients: int) -> int:
        """K of coded storage: ``blocks-per-shard``, or chosen from C when it is 0."""
        if self.blocks_per_shard:
            return self.blocks_per_shard
        return auto_blocks_per_shard(num_clients, self.privacy_t, self.coded_loss_budget)

    def _validate_code_size(self, num_clients: int) -> None:
        """K >= 1 and K + T <= C: every shard's round decodes from K + T slices."""
        k, t, c = self.blocks(num_clients), self.privacy_t, num_clients
        if self.blocks_per_shard == 0 and k < 1:
            raise bad("coded-loss-budget", self.coded_loss_budget,
                      f"a budget that leaves data blocks with storage='coded': "
                      f"floor((1 - budget) x num-clients = {c}) - privacy-t = {t} "
                      f"= {k} blocks a shard; lower it or privacy-t")
        if k + t > c:  # explicit K only: a chosen K + T is at most floor((1 - f) C)
            raise bad("blocks-per-shard", self.blocks_per_shard,
                      f"at most num-clients - privacy-t = {c - t} blocks a shard with "
                      f"storage='coded': each shard's round decodes from "
                      f"blocks-per-shard + privacy-t = {k + t} slices, one a client")

"""The run configuration: parsed once from ``[tool.flwr.app.config]`` and validated.

Every setting lives in ``pyproject.toml`` with a default; ``--run-config`` and the
TOML presets in ``presets/`` override them. :func:`RunConfig.from_run_config`
turns Flower's flat ``context.run_config`` mapping into a typed, frozen object and
rejects bad values before any training starts, naming the key, the value and what
is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from strategies.factory import SERVER_DEFAULTS
from task.backdoor import MAX_TRIGGER
from task.config import DATASETS, OPTIMIZERS, PARTITIONS

# Stock Flower strategies a shard may use as its aggregator (run-config
# ``shard-strategy``). Robust aggregators that need extra arguments are left out.
SHARD_STRATEGIES = (
    "FedAvg",
    "FedProx",
    "FedAvgM",
    "FedAdam",
    "FedAdagrad",
    "FedYogi",
    "FedMedian",
    "FedTrimmedAvg",
)


FRAMEWORKS = ("SE", "FR", "FE", "RR")
REQUEST_DISTRIBUTIONS = ("even", "adapt")
REQUEST_MODES = ("sequential", "concurrent")
STORAGE_MODES = ("uncoded", "coded")


MAX_SEED = 2**32 - 1
MAX_CLIENTS = 100_000  # beyond any dataset here (MNIST: 60,000 training images);
# the ServerApp refines it with the data (server_app.preflight.check_partition)
MAX_LR = 10.0  # a local step size above this diverges for every model of this app
TEXT_CONTEXT = 64  # task.nanogpt.GPTConfig.block_size: the GPT's context


class ConfigError(ValueError):
    """A run-config value that is not allowed; the message names key and value."""


def _bad(key: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"run-config '{key}' = {value!r} is not allowed: {allowed}")


@dataclass(frozen=True)
class RunConfig:
    """Typed, validated run settings (one field per run-config key, kebab -> snake).

    Attributes mirror ``[tool.flwr.app.config]``; README.md explains each. Times are
    seconds, learning rates are per local optimizer step (``optimizer``).
    """

    dataset: str = "mnist"
    partition: str = "iid"
    num_clients: int = 100
    num_shards: int = 4
    clients_per_round: int = 20
    local_epochs: int = 2
    num_rounds: int = 10
    batch_size: int = 32
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.5
    seed: int = 0
    data_dir: str = ""
    results_dir: str = ""
    run_name: str = ""
    shard_strategy: str = "FedAvg"
    proximal_mu: float = 0.01
    server_lr: float = 0.0  # 0: the shard strategy's own (strategies.factory)
    server_momentum: float = -1.0  # -1: the shard strategy's own
    block_size: int = 64
    round_timeout: float = 600.0
    client_samples: int = 0
    test_samples: int = 0
    frameworks: str = "SE,FR,FE,RR"
    num_requests: int = 1
    clients_per_request: int = 1
    request_distribution: str = "even"
    request_mode: str = "sequential"
    forget_clients: str = ""
    retrain_ratio: float = 2.0
    calibration_interval: int = 1
    baseline_shards: int = 1
    link_rate_mbps: float = 100.0
    mia: bool = True
    mia_samples: int = 2000
    storage: str = "uncoded"
    blocks_per_shard: int = 5
    quant_scale_bits: int = 24
    mia_shadows: int = 0
    backdoor_trigger: int = 0
    backdoor_fraction: float = 0.5
    backdoor_target: int = 0

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, object]) -> RunConfig:
        """Build and validate a config from Flower's ``context.run_config``.

        Parameters
        ----------
        run_config : Mapping[str, object]
            Kebab-case keys as in ``pyproject.toml``; missing keys take defaults.

        Returns
        -------
        RunConfig

        Raises
        ------
        ConfigError
            An unknown key, a value of the wrong type, or a value out of range.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, object] = {}
        for key, raw in run_config.items():
            name = key.replace("-", "_")
            if name not in fields:
                continue  # keys of later features or of the user; ignored here
            default = fields[name].default
            values[name] = _coerce(key, raw, type(default))
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Check every setting alone and in combination; raise on the first bad one.

        Only what needs neither data nor nodes; :func:`server_app.preflight.check_run`
        adds the requests, the baseline shards, the coded-storage range and the
        partition. Raises :class:`ConfigError` naming the key, value and what is
        allowed.
        """
        if self.dataset not in DATASETS:
            raise _bad("dataset", self.dataset, f"one of {', '.join(DATASETS)}")
        if self.partition not in PARTITIONS:
            raise _bad("partition", self.partition, f"one of {', '.join(PARTITIONS)}")
        for key in ("num-clients", "num-shards", "clients-per-round", "local-epochs",
                    "num-rounds", "batch-size", "block-size"):
            value = getattr(self, key.replace("-", "_"))
            if value < 1:
                raise _bad(key, value, "a positive integer")
        for key in ("client-samples", "test-samples"):
            value = getattr(self, key.replace("-", "_"))
            if value < 0:
                raise _bad(key, value, "0 (all) or a positive integer")
        if self.num_clients > MAX_CLIENTS:
            raise _bad("num-clients", self.num_clients,
                       f"at most {MAX_CLIENTS} (one SuperNode and at least one "
                       "training sample each)")
        if not 0 <= self.seed <= MAX_SEED:
            raise _bad("seed", self.seed, f"an integer in [0, {MAX_SEED}]")
        if self.dataset == "shakespeare" and not 2 <= self.block_size <= TEXT_CONTEXT:
            raise _bad("block-size", self.block_size,
                       f"an integer in [2, {TEXT_CONTEXT}] with dataset='shakespeare' "
                       f"(the character GPT's context is {TEXT_CONTEXT})")
        self._validate_topology()
        self._validate_training()
        self._validate_server()
        self._validate_unlearning()
        self._validate_forget_clients()
        self._validate_storage()
        self._validate_backdoor()
        if self.run_name and (os.sep in self.run_name or self.run_name.startswith(".")):
            raise _bad("run-name", self.run_name,
                       "a plain folder name (no path separator, no leading dot)")

    def _validate_topology(self) -> None:
        if self.num_shards > self.num_clients:
            raise _bad("num-shards", self.num_shards,
                       f"at most num-clients = {self.num_clients}")
        if self.clients_per_round % self.num_shards:
            raise _bad("clients-per-round", self.clients_per_round,
                       f"a multiple of num-shards = {self.num_shards}, so every "
                       "shard samples the same number of clients")
        smallest = self.num_clients // self.num_shards
        if self.clients_per_round // self.num_shards > smallest:
            raise _bad("clients-per-round", self.clients_per_round,
                       f"at most {smallest * self.num_shards}: each of the "
                       f"{self.num_shards} shards has only {smallest} clients")

    def _validate_training(self) -> None:
        if not 0 < self.lr <= MAX_LR:
            raise _bad("lr", self.lr, f"a positive number, at most {MAX_LR:g} "
                       "(larger steps diverge for every model here)")
        if not self.round_timeout > 0:
            raise _bad("round-timeout", self.round_timeout, "a positive number")
        if self.optimizer not in OPTIMIZERS:
            raise _bad("optimizer", self.optimizer, f"one of {', '.join(OPTIMIZERS)}")
        if not 0 <= self.momentum < 1:
            raise _bad("momentum", self.momentum, "a number in [0, 1)")
        if not self.proximal_mu >= 0:
            raise _bad("proximal-mu", self.proximal_mu, "a number >= 0")
        if self.shard_strategy not in SHARD_STRATEGIES:
            raise _bad("shard-strategy", self.shard_strategy,
                       f"one of {', '.join(SHARD_STRATEGIES)}")

    def _validate_server(self) -> None:
        """``server-lr`` and ``server-momentum``: range, and only where they apply."""
        if not (math.isfinite(self.server_lr) and self.server_lr >= 0):
            raise _bad("server-lr", self.server_lr,
                       "0 (the shard strategy's own default) or a finite number > 0")
        if not (self.server_momentum == -1 or 0 <= self.server_momentum < 1):
            raise _bad("server-momentum", self.server_momentum,
                       "-1 (the shard strategy's own default) or a number in [0, 1)")
        own = SERVER_DEFAULTS.get(self.shard_strategy, {})
        for key, unset in (("server-lr", 0.0), ("server-momentum", -1.0)):
            name = key.replace("-", "_")
            value = getattr(self, name)
            if value != unset and name not in own:
                users = [n for n, d in SERVER_DEFAULTS.items() if name in d]
                raise _bad(key, value, f"{unset:g} (unset) with shard-strategy "
                           f"{self.shard_strategy}, which has no such setting; it "
                           f"applies to {', '.join(users)}")

    def _validate_unlearning(self) -> None:
        names = self.framework_list
        unknown = [f for f in names if f not in FRAMEWORKS]
        if unknown or not self.frameworks.strip() or len(set(names)) != len(names):
            raise _bad("frameworks", self.frameworks,
                       f"a comma-separated list of {', '.join(FRAMEWORKS)}, each once, "
                       "or 'none'" if self.frameworks.strip()
                       else "at least one framework, or 'none'")
        for key in ("num-requests", "clients-per-request", "calibration-interval",
                    "baseline-shards", "mia-samples"):
            value = getattr(self, key.replace("-", "_"))
            if value < 1:
                raise _bad(key, value, "a positive integer")
        if self.request_distribution not in REQUEST_DISTRIBUTIONS:
            raise _bad("request-distribution", self.request_distribution,
                       f"one of {', '.join(REQUEST_DISTRIBUTIONS)}")
        if self.request_mode not in REQUEST_MODES:
            raise _bad("request-mode", self.request_mode,
                       f"one of {', '.join(REQUEST_MODES)}")
        if not (self.retrain_ratio > 0 and self.local_epochs / self.retrain_ratio > 0):
            raise _bad("retrain-ratio", self.retrain_ratio,
                       "a positive number (r; retained clients train L/r epochs)")
        if not self.link_rate_mbps > 0:
            raise _bad("link-rate-mbps", self.link_rate_mbps, "a positive number")
        if self.clients_per_round % self.baseline_shards or (
                self.clients_per_round // self.baseline_shards
                > self.num_clients // self.baseline_shards):
            raise _bad("baseline-shards", self.baseline_shards,
                       f"a divisor of clients-per-round = {self.clients_per_round} "
                       "whose shards are large enough to sample from")

    def _validate_forget_clients(self) -> None:
        tokens = [t.strip() for t in self.forget_clients.split(",") if t.strip()]
        if not tokens:
            return
        if not all(t.isdigit() for t in tokens):
            raise _bad("forget-clients", self.forget_clients,
                       f"comma-separated partition ids in 0..{self.num_clients - 1}, "
                       "e.g. '3,17'")
        ids = [int(t) for t in tokens]
        if max(ids) >= self.num_clients:
            raise _bad("forget-clients", self.forget_clients,
                       f"partition ids in 0..{self.num_clients - 1} "
                       f"(num-clients = {self.num_clients})")
        if len(set(ids)) != len(ids):
            raise _bad("forget-clients", self.forget_clients, "each id once")
        if not self.framework_list:
            raise _bad("forget-clients", self.forget_clients,
                       "'' with frameworks = 'none' (nothing would forget them)")
        generator = {"num-requests": (self.num_requests, 1),
                     "clients-per-request": (self.clients_per_request, 1),
                     "request-distribution": (self.request_distribution, "even")}
        for key, (value, default) in generator.items():
            if value != default:
                raise _bad(key, value, f"{default!r} when forget-clients is set "
                           "(forget-clients is the one request; this key is for "
                           "generated requests)")

    def _validate_storage(self) -> None:
        if self.storage not in STORAGE_MODES:
            raise _bad("storage", self.storage, f"one of {', '.join(STORAGE_MODES)}")
        if self.blocks_per_shard < 1:
            raise _bad("blocks-per-shard", self.blocks_per_shard, "a positive integer")
        if not 1 <= self.quant_scale_bits <= 30:
            raise _bad("quant-scale-bits", self.quant_scale_bits,
                       "an integer in [1, 30] (fractional bits of the fixed point)")
        k = self.num_shards * self.blocks_per_shard
        if self.storage == "coded" and k > self.num_clients:
            raise _bad("blocks-per-shard", self.blocks_per_shard,
                       f"at most num-clients / num-shards = "
                       f"{self.num_clients // self.num_shards} with storage='coded': "
                       f"the num-shards x blocks-per-shard = {k} data blocks of a round "
                       f"need at least as many clients holding slices")

    def _validate_backdoor(self) -> None:
        """``backdoor-*`` and ``mia-shadows``: ranges, images only, forget-clients."""
        if not 0 <= self.backdoor_trigger <= MAX_TRIGGER:
            raise _bad("backdoor-trigger", self.backdoor_trigger,
                       f"0 (off) or a square side in pixels, 1..{MAX_TRIGGER}")
        if not 0.0 <= self.backdoor_fraction <= 1.0:
            raise _bad("backdoor-fraction", self.backdoor_fraction,
                       "a share of a poisoned client's images in [0, 1]")
        if not 0 <= self.backdoor_target <= 9:
            raise _bad("backdoor-target", self.backdoor_target,
                       "a class index in 0..9")
        if not 0 <= self.mia_shadows <= 32:
            raise _bad("mia-shadows", self.mia_shadows,
                       "0 (attack fit on the original model) or 1..32 shadow models")
        if self.mia_shadows and (self.dataset == "shakespeare" or not self.mia):
            raise _bad("mia-shadows", self.mia_shadows,
                       "0 unless mia = true and the dataset has classes (images)")
        if self.backdoor_trigger == 0:
            return
        if self.dataset == "shakespeare":
            raise _bad("backdoor-trigger", self.backdoor_trigger,
                       "0 with dataset='shakespeare' (image datasets only)")
        if not self.forget_client_list:
            raise _bad("backdoor-trigger", self.backdoor_trigger,
                       "0 unless forget-clients names the poisoned clients (the "
                       "clients of the one unlearning request)")

    @property
    def framework_list(self) -> list[str]:
        """The frameworks to run, upper-case, in the given order ([] for 'none')."""
        if self.frameworks.strip().lower() == "none":
            return []
        return [f.strip().upper() for f in self.frameworks.split(",") if f.strip()]

    @property
    def forget_client_list(self) -> list[int]:
        """Explicit ``forget-clients`` as ints, in the given order ([] if unset)."""
        return [int(t) for t in self.forget_clients.split(",") if t.strip()]

    @property
    def shard_strategy_options(self) -> dict[str, float | None]:
        """Keyword arguments of ``make_stock_strategy`` besides name and sizes.

        ``server-lr`` 0 and ``server-momentum`` -1 become None: the shard
        strategy's own default (``strategies.factory.SERVER_DEFAULTS``).
        """
        return {"proximal_mu": self.proximal_mu,
                "server_lr": self.server_lr or None,
                "server_momentum": None if self.server_momentum == -1
                else self.server_momentum}

    def resolved_results_dir(self) -> Path:
        """Absolute results folder: ``results-dir``, ``$SE_RESULTS_DIR``, or a cache.

        ``flwr run`` may start the ServerApp in another working directory, so a
        relative path is made absolute against the current one and said in logs.
        """
        raw = self.results_dir or os.environ.get("SE_RESULTS_DIR", "")
        if not raw:
            raw = str(Path.home() / ".cache" / "sharding-eraser" / "results")
        return Path(raw).expanduser().resolve()

    def resolved_run_name(self) -> str:
        """``run-name``, or ``<dataset>-<partition>-<UTC time>`` when unset."""
        if self.run_name:
            return self.run_name
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        return f"{self.dataset}-{self.partition}-{stamp}"

    def as_dict(self) -> dict[str, object]:
        """The settings with their kebab-case run-config keys (for summary.json)."""
        return {k.replace("_", "-"): v for k, v in dataclasses.asdict(self).items()}


def _coerce(key: str, raw: object, kind: type) -> object:
    """Convert a run-config value to the field's type, or raise ConfigError.

    Numbers must be finite: NaN and infinities are refused for every numeric
    key, naming it (NaN passes every ``<`` / ``>`` range check unnoticed).
    """
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        raise _bad(key, raw, "true or false")
    if kind in (int, float) and isinstance(raw, float) and not math.isfinite(raw):
        raise _bad(key, raw, "a finite number" if kind is float else "an integer")
    if kind is int:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) \
                or int(raw) != raw:
            raise _bad(key, raw, "an integer")
        return int(raw)
    if kind is float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise _bad(key, raw, "a number")
        return float(raw)
    if not isinstance(raw, str):
        raise _bad(key, raw, "a string")
    return raw.strip()

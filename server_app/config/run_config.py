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

from history.coded_catalog import auto_blocks_per_shard
from server_app.config.features import check_backdoor, check_storage
from server_app.config.stages import check_stages
from server_app.config.values import (  # noqa: F401 (ConfigError is this module's API)
    EPOCHS_PER_RATIO,
    FLOAT_RANGE,
    INT64_MAX,
    MAX_CLIENTS,
    MAX_INT,
    MAX_LR,
    MAX_SEED,
    MAX_SERVER_LR,
    RUN_NAME,
    TEXT_CONTEXT,
    ConfigError,
    bad,
    coerce,
)
from strategies.factory import SERVER_DEFAULTS
from task.config import DATASETS, MAX_PARTITION_ALPHA, OPTIMIZERS, PARTITIONS

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


@dataclass(frozen=True)
class RunConfig:
    """Typed, validated run settings (one field per run-config key, kebab -> snake).

    Attributes mirror ``[tool.flwr.app.config]``; docs/CONFIG.md explains each. Times are
    seconds, learning rates are per local optimizer step (``optimizer``).
    """

    dataset: str = "mnist"
    partition: str = "iid"
    partition_alpha: float = 0.5
    classes_per_client: int = 2
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
    blocks_per_shard: int = 0
    quant_scale_bits: int = 24
    privacy_t: int = 0
    coded_loss_budget: float = 0.5
    mia_shadows: int = 0
    backdoor_trigger: int = 0
    backdoor_fraction: float = 0.5
    backdoor_target: int = 0
    num_stages: int = 1
    joins_per_stage: int = 0
    leaves_per_stage: int = 0
    requests_per_stage: int = 0

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
            values[name] = coerce(key, raw, type(default))
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
            raise bad("dataset", self.dataset, f"one of {', '.join(DATASETS)}")
        if self.partition not in PARTITIONS:
            raise bad("partition", self.partition, f"one of {', '.join(PARTITIONS)}")
        for key in ("num-clients", "num-shards", "clients-per-round", "local-epochs",
                    "num-rounds", "batch-size", "block-size"):
            value = getattr(self, key.replace("-", "_"))
            if value < 1:
                raise bad(key, value, "a positive integer")
        for key in ("client-samples", "test-samples"):
            value = getattr(self, key.replace("-", "_"))
            if value < 0:
                raise bad(key, value, "0 (all) or a positive integer")
        self._validate_bounds()
        if self.num_clients > MAX_CLIENTS:
            raise bad("num-clients", self.num_clients,
                      f"at most {MAX_CLIENTS} (one SuperNode and at least one "
                      "training sample each)")
        if not 0 <= self.seed <= MAX_SEED:
            raise bad("seed", self.seed, f"an integer in [0, {MAX_SEED}]")
        if self.dataset == "shakespeare" and not 2 <= self.block_size <= TEXT_CONTEXT:
            raise bad("block-size", self.block_size,
                      f"an integer in [2, {TEXT_CONTEXT}] with dataset='shakespeare' "
                      f"(the character GPT's context is {TEXT_CONTEXT})")
        self._validate_topology()
        self._validate_training()
        self._validate_server()
        self._validate_unlearning()
        self._validate_forget_clients()
        check_storage(self)
        check_backdoor(self)
        check_stages(self)
        if self.run_name and not RUN_NAME.fullmatch(self.run_name):
            raise bad("run-name", self.run_name,
                      "a plain folder name of 1..100 characters A-Z a-z 0-9 . _ - "
                      "(no leading dot)")

    def _validate_bounds(self) -> None:
        """Each numeric key in its sanity range (:data:`MAX_INT`, :data:`FLOAT_RANGE`)."""
        for key, most in MAX_INT.items():
            value = getattr(self, key.replace("-", "_"))
            if value > most:
                raise bad(key, value, f"at most {most}")
        for key, (least, most) in FLOAT_RANGE.items():
            value = getattr(self, key.replace("-", "_"))
            if not least <= value <= most and not (key == "server-lr" and value == 0):
                raise bad(key, value, f"a number in [{least:g}, {most:g}]")

    def _validate_partition(self) -> None:
        if not 0 < self.partition_alpha <= MAX_PARTITION_ALPHA:
            raise bad("partition-alpha", self.partition_alpha,
                      f"a finite number in (0, {MAX_PARTITION_ALPHA:g}] (Dirichlet "
                      "concentration of partition='dirichlet'; smaller = more skewed)")
        if self.classes_per_client < 1:
            raise bad("classes-per-client", self.classes_per_client,
                      "a positive integer, at most the task's classes (10), used by "
                      "partition='pathological'")

    def _validate_topology(self) -> None:
        self._validate_partition()
        if self.num_shards > self.num_clients:
            raise bad("num-shards", self.num_shards,
                      f"at most num-clients = {self.num_clients}")
        if self.clients_per_round % self.num_shards:
            raise bad("clients-per-round", self.clients_per_round,
                      f"a multiple of num-shards = {self.num_shards}, so every "
                      "shard samples the same number of clients")
        smallest = self.num_clients // self.num_shards
        if self.clients_per_round // self.num_shards > smallest:
            raise bad("clients-per-round", self.clients_per_round,
                      f"at most {smallest * self.num_shards}: each of the "
                      f"{self.num_shards} shards has only {smallest} clients")

    def _validate_training(self) -> None:
        if not 0 < self.lr <= MAX_LR:
            raise bad("lr", self.lr, f"a positive number, at most {MAX_LR:g} "
                      "(larger steps diverge for every model here)")
        if not self.round_timeout > 0:
            raise bad("round-timeout", self.round_timeout, "a positive number")
        if self.optimizer not in OPTIMIZERS:
            raise bad("optimizer", self.optimizer, f"one of {', '.join(OPTIMIZERS)}")
        if not 0 <= self.momentum < 1:
            raise bad("momentum", self.momentum, "a number in [0, 1)")
        if not self.proximal_mu >= 0:
            raise bad("proximal-mu", self.proximal_mu, "a number >= 0")
        if self.shard_strategy not in SHARD_STRATEGIES:
            raise bad("shard-strategy", self.shard_strategy,
                      f"one of {', '.join(SHARD_STRATEGIES)}")

    def _validate_server(self) -> None:
        """``server-lr`` and ``server-momentum``: range, and only where they apply."""
        if not (math.isfinite(self.server_lr) and 0 <= self.server_lr <= MAX_SERVER_LR):
            raise bad("server-lr", self.server_lr,
                      "0 (the shard strategy's own default) or a finite number in "
                      f"(0, {MAX_SERVER_LR:g}]")
        if not (self.server_momentum == -1 or 0 <= self.server_momentum < 1):
            raise bad("server-momentum", self.server_momentum,
                      "-1 (the shard strategy's own default) or a number in [0, 1)")
        own = SERVER_DEFAULTS.get(self.shard_strategy, {})
        for key, unset in (("server-lr", 0.0), ("server-momentum", -1.0)):
            name = key.replace("-", "_")
            value = getattr(self, name)
            if value != unset and name not in own:
                users = [n for n, d in SERVER_DEFAULTS.items() if name in d]
                raise bad(key, value, f"{unset:g} (unset) with shard-strategy "
                          f"{self.shard_strategy}, which has no such setting; it "
                          f"applies to {', '.join(users)}")

    def _validate_unlearning(self) -> None:
        names = self.framework_list
        unknown = [f for f in names if f not in FRAMEWORKS]
        empty = not names and self.frameworks.strip().lower() != "none"
        if unknown or empty or len(set(names)) != len(names):
            raise bad("frameworks", self.frameworks,
                      f"a comma-separated list of {', '.join(FRAMEWORKS)}, each once, "
                      "or 'none'" if not empty
                      else "at least one framework, or 'none'")
        for key in ("num-requests", "clients-per-request", "calibration-interval",
                    "baseline-shards", "mia-samples"):
            value = getattr(self, key.replace("-", "_"))
            if value < 1:
                raise bad(key, value, "a positive integer")
        if self.request_distribution not in REQUEST_DISTRIBUTIONS:
            raise bad("request-distribution", self.request_distribution,
                      f"one of {', '.join(REQUEST_DISTRIBUTIONS)}")
        if self.request_mode not in REQUEST_MODES:
            raise bad("request-mode", self.request_mode,
                      f"one of {', '.join(REQUEST_MODES)}")
        least, most = EPOCHS_PER_RATIO
        if not (self.retrain_ratio > 0
                and least <= self.local_epochs / self.retrain_ratio <= most):
            raise bad("retrain-ratio", self.retrain_ratio,
                      f"a positive number r with local-epochs / r in [{least:g}, "
                      f"{most:g}] (retained clients train L/r epochs; "
                      f"L = {self.local_epochs})")
        if self.clients_per_round % self.baseline_shards or (
                self.clients_per_round // self.baseline_shards
                > self.num_clients // self.baseline_shards):
            raise bad("baseline-shards", self.baseline_shards,
                      f"a divisor of clients-per-round = {self.clients_per_round} "
                      "whose shards are large enough to sample from")

    def _validate_forget_clients(self) -> None:
        tokens = [t.strip() for t in self.forget_clients.split(",") if t.strip()]
        if not tokens:
            return
        if not all(t.isascii() and t.isdigit() for t in tokens):
            raise bad("forget-clients", self.forget_clients,
                      f"comma-separated partition ids in 0..{self.num_clients - 1}, "
                      "e.g. '3,17'")
        ids = [int(t) for t in tokens]
        if max(ids) >= self.num_clients:
            raise bad("forget-clients", self.forget_clients,
                      f"partition ids in 0..{self.num_clients - 1} "
                      f"(num-clients = {self.num_clients})")
        if len(set(ids)) != len(ids):
            raise bad("forget-clients", self.forget_clients, "each id once")
        if not self.framework_list:
            raise bad("forget-clients", self.forget_clients,
                      "'' with frameworks = 'none' (nothing would forget them)")
        generator = {"num-requests": (self.num_requests, 1),
                     "clients-per-request": (self.clients_per_request, 1),
                     "request-distribution": (self.request_distribution, "even")}
        for key, (value, default) in generator.items():
            if value != default:
                raise bad(key, value, f"{default!r} when forget-clients is set "
                          "(forget-clients is the one request; this key is for "
                          "generated requests)")

    @property
    def coded_blocks_per_shard(self) -> int:
        """K of coded storage: ``blocks-per-shard``, or chosen from C when it is 0."""
        if self.blocks_per_shard:
            return self.blocks_per_shard
        return auto_blocks_per_shard(self.num_clients, self.privacy_t,
                                     self.coded_loss_budget)

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

"""Run-config section ``training``: shards, rounds, local training, shard strategy."""

from __future__ import annotations

import math
from dataclasses import dataclass

from server_app.config.profile import DeviceProfile, ProfileError, load_profile
from server_app.config.values import MAX_SERVER_LR, ConfigError, bad
from strategies.factory import SERVER_DEFAULTS
from task.config import DataConfig
from task.device import check_device
from task.training_settings import LocalTraining, TrainingSettings

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


@dataclass(frozen=True)
class TrainingConfig(LocalTraining):
    """How the federation learns (paper notation: S, G, L).

    Local-training keys and ranges: :class:`task.training_settings.LocalTraining`'s
    (what messages carry); ``local_epochs`` here is L, an int.

    Attributes
    ----------
    num_shards : int
        S, isolated shards (one aggregator each).
    clients_per_round : int
        Clients sampled a round over all shards (a multiple of S).
    num_rounds : int
        G, rounds of a learning stage.
    shard_strategy : str
        Each shard's stock Flower strategy, one of :data:`SHARD_STRATEGIES`.
    proximal_mu : float
        FedProx's mu.
    server_lr, server_momentum : float
        Server settings of the shard strategy (0 / -1: its own default).
    round_timeout : float
        Seconds to wait for a round's replies.
    link_rate_mbps : float
        Link rate of the communication model (Mbit/s); a device profile with
        its own link rate replaces it in the modelled times.
    device_profile : str
        The device profile pricing the modelled times
        (:mod:`server_app.config.profile`): ``""`` (the calibrated
        ``cpu-core``), a shipped profile's name, or a profile file's path.
    device : str
        Where local training, central evaluation and the audit run: ``auto``
        (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N`` (:mod:`task.device`);
        each process resolves it on its own machine.
    client_gpus : float
        Ray simulation: GPUs each ClientApp reserves (Flower's
        ``client-resources-num-gpus``, fractional; 0: none reserved).
    """

    num_shards: int = 4
    clients_per_round: int = 20
    num_rounds: int = 10
    shard_strategy: str = "FedAvg"
    proximal_mu: float = 0.01
    server_lr: float = 0.0  # 0: the shard strategy's own (strategies.factory)
    server_momentum: float = -1.0  # -1: the shard strategy's own
    round_timeout: float = 600.0
    link_rate_mbps: float = 100.0
    device_profile: str = ""
    device: str = "auto"
    client_gpus: float = 0.0

    def validate(self, data: DataConfig) -> None:
        """Raise :class:`ConfigError` on the first bad value; ``data`` gives C."""
        self.check_ranges()
        self.check_positive("num-shards", "clients-per-round", "num-rounds")
        self.check_bounds()
        self._validate_topology(data.num_clients)
        self._validate_strategy()
        self._validate_server()
        try:
            check_device(self.device)
        except ValueError as err:  # one line naming 'device'
            raise ConfigError(str(err)) from None
        self.profile()

    def profile(self) -> DeviceProfile:
        """The run's device profile (:func:`server_app.config.profile.load_profile`).

        Raises
        ------
        ConfigError
            One line naming ``device-profile``, its value and what is allowed.
        """
        try:
            return load_profile(self.device_profile)
        except ProfileError as err:
            raise bad("device-profile", self.device_profile, str(err)) from None

    def _validate_topology(self, num_clients: int) -> None:
        if self.num_shards > num_clients:
            raise bad("num-shards", self.num_shards,
                      f"at most num-clients = {num_clients}")
        if self.clients_per_round % self.num_shards:
            raise bad("clients-per-round", self.clients_per_round,
                      f"a multiple of num-shards = {self.num_shards}, so every "
                      "shard samples the same number of clients")
        smallest = num_clients // self.num_shards
        if self.clients_per_round // self.num_shards > smallest:
            raise bad("clients-per-round", self.clients_per_round,
                      f"at most {smallest * self.num_shards}: each of the "
                      f"{self.num_shards} shards has only {smallest} "
                      f"client{'' if smallest == 1 else 's'}")

    def _validate_strategy(self) -> None:
        if not self.round_timeout > 0:
            raise bad("round-timeout", self.round_timeout, "a positive number")
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

    def local_settings(self, seed: int, data_dir: str = "") -> TrainingSettings:
        """The clients' local training of a learning round, as messages carry it.

        Parameters
        ----------
        seed : int
            The run's seed (run-config ``seed``).
        data_dir : str
            The dataset's folder, resolved (``""``: none sent).

        Returns
        -------
        TrainingSettings
            This section's :class:`~task.training_settings.LocalTraining` keys
            (``local-epochs`` L, as a float); the per-message keys at their
            defaults (the strategies set them).

        Raises
        ------
        ConfigError
            A value out of :class:`TrainingSettings`' ranges (none after
            :meth:`validate`).
        """
        local = {name: getattr(self, name) for name in LocalTraining.keys().values()}
        return TrainingSettings(**local, seed=seed, data_dir=data_dir)

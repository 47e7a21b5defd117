"""Run-config section ``unlearning``: the frameworks, the requests and retraining."""

from __future__ import annotations

from dataclasses import dataclass

import server_app.config.methods as registry
from server_app.config.training import TrainingConfig
from server_app.config.values import EPOCHS_PER_RATIO, bad
from task import records
from task.config import DataConfig, check_spec, is_plugin
from task.section import Section

REQUEST_DISTRIBUTIONS = ("even", "adapt")
REQUEST_MODES = ("sequential", "concurrent")


@dataclass(frozen=True)
class UnlearningConfig(Section):
    """Who is forgotten, how, and by which frameworks (paper Sec. 4-5).

    Attributes
    ----------
    frameworks : str
        Comma-separated registered methods (:mod:`server_app.config.methods`,
        any case) and ``package.module:Class`` unlearning methods of one's own
        (:mod:`server_app.unlearning.methods`), or ``none``.
    num_requests, clients_per_request : int
        K generated requests of this many clients each.
    request_distribution : str
        ``even`` (spread over shards) or ``adapt`` (all in one shard).
    request_mode : str
        ``sequential`` (each request alone) or ``concurrent`` (one batch).
    forget_clients : str
        Comma-separated partition ids: the one request instead of generated ones.
    forget_records : str
        A records request instead: ``"17:3,18,40-52; 21:0-9"``, record ids
        (positions in each client's partition, :mod:`task.records`) erased
        while their clients stay.
    forget_labels : str
        A class-level request instead: labels whose every record is erased on
        every client (classification tasks).
    retrain_ratio : float
        r: retained clients train L / r epochs in a calibration round.
    calibration_interval : int
        FedEraser's interval: every n-th stored round is replayed.
    baseline_shards : int
        Shards of the baselines' federation (1: unsharded).
    """

    frameworks: str = "SE,FR,FE,RR,SISA"
    num_requests: int = 1
    clients_per_request: int = 1
    request_distribution: str = "even"
    request_mode: str = "sequential"
    forget_clients: str = ""
    forget_records: str = ""
    forget_labels: str = ""
    retrain_ratio: float = 2.0
    calibration_interval: int = 1
    baseline_shards: int = 1

    def validate(self, data: DataConfig, training: TrainingConfig) -> None:
        """Raise :class:`ConfigError` on the first bad value (C and L from the others)."""
        self._validate_frameworks()
        self.check_positive("num-requests", "clients-per-request",
                            "calibration-interval", "baseline-shards")
        self.check_bounds()
        if self.forget_labels:
            data.refuse_without_train(
                "forget-labels", self.forget_labels, "a class request is checked "
                "against every client's labels (each must keep a record)")
        if self.request_distribution not in REQUEST_DISTRIBUTIONS:
            raise bad("request-distribution", self.request_distribution,
                      f"one of {', '.join(REQUEST_DISTRIBUTIONS)}")
        if self.request_mode not in REQUEST_MODES:
            raise bad("request-mode", self.request_mode,
                      f"one of {', '.join(REQUEST_MODES)}")
        least, most = EPOCHS_PER_RATIO
        if not (self.retrain_ratio > 0
                and least <= training.local_epochs / self.retrain_ratio <= most):
            raise bad("retrain-ratio", self.retrain_ratio,
                      f"a positive number r with local-epochs / r in [{least:g}, "
                      f"{most:g}] (retained clients train L/r epochs; "
                      f"L = {training.local_epochs})")
        per_round, clients = training.clients_per_round, data.num_clients
        if per_round % self.baseline_shards or (
                per_round // self.baseline_shards > clients // self.baseline_shards):
            raise bad("baseline-shards", self.baseline_shards,
                      f"a divisor of clients-per-round = {per_round} "
                      "whose shards are large enough to sample from")
        self._validate_forget_clients(clients)
        self._validate_erasure(clients)

    def _validate_erasure(self, num_clients: int) -> None:
        """``forget-records`` / ``forget-labels``: the run's one request, if set."""
        for key, parse in (("forget-records", records.parse_records),
                           ("forget-labels", records.parse_labels)):
            value = getattr(self, key.replace("-", "_"))
            try:
                parsed = parse(value)
            except ValueError as err:
                raise bad(key, value, str(err)) from None
            if not parsed:
                continue
            if key == "forget-records" and max(parsed) >= num_clients:
                raise bad(key, value, f"clients in 0..{num_clients - 1} "
                          f"(num-clients = {num_clients})")
            if self.forget_clients.strip():
                raise bad(key, value, "'' when forget-clients is set (a run plans one "
                          "kind of request: clients, records or labels)")
            if key == "forget-labels" and self.forget_records.strip():
                raise bad(key, value, "'' when forget-records is set (one request)")
            refused = [m.name for m in self.method_infos if not m.erases_records]
            if not self.framework_list or refused:
                able = ", ".join(m for m in registry.names()
                                 if registry.has(m, "erases_records"))
                raise bad("frameworks", self.frameworks,
                          f"methods that erase records while their clients stay ({able}) "
                          f"with {key}: {', '.join(refused) or 'none'} forget whole "
                          "clients only")
            self._check_one_request(key)

    def _validate_frameworks(self) -> None:
        names, builtins = self.framework_list, registry.names()
        allowed = (f"a comma-separated list of {', '.join(builtins)} or "
                   "'package.module:Class' methods, each once, or 'none'")
        empty = not names and self.frameworks.strip().lower() != "none"
        if empty:
            raise bad("frameworks", self.frameworks, "at least one framework, or 'none'")
        for token in self._tokens():
            try:
                check_spec(registry.canonical(token) or token, "frameworks", builtins)
            except ValueError:
                raise bad("frameworks", self.frameworks, allowed) from None
        if len(set(names)) != len(names):
            raise bad("frameworks", self.frameworks, allowed)
        clash = [n for n in self.plugin_methods
                 if registry.canonical(n) or n.lower() == "original"]
        if clash:
            raise bad("frameworks", self.frameworks,
                      f"methods whose class is not named {clash[0]!r} "
                      f"({', '.join((*builtins, 'original'))} are taken, in any case)")

    def _validate_forget_clients(self, num_clients: int) -> None:
        tokens = [t.strip() for t in self.forget_clients.split(",") if t.strip()]
        if not tokens:
            return
        if not all(t.isascii() and t.isdigit() for t in tokens):
            raise bad("forget-clients", self.forget_clients,
                      f"comma-separated partition ids in 0..{num_clients - 1}, "
                      "e.g. '3,17'")
        ids = [int(t) for t in tokens]
        if max(ids) >= num_clients:
            raise bad("forget-clients", self.forget_clients,
                      f"partition ids in 0..{num_clients - 1} "
                      f"(num-clients = {num_clients})")
        if len(set(ids)) != len(ids):
            raise bad("forget-clients", self.forget_clients, "each id once")
        if not self.framework_list:
            raise bad("forget-clients", self.forget_clients,
                      "'' with frameworks = 'none' (nothing would forget them)")
        self._check_one_request("forget-clients")

    def _check_one_request(self, key: str) -> None:
        """The request generator's keys at their defaults: ``key`` is the one request."""
        generator = {"num-requests": (self.num_requests, 1),
                     "clients-per-request": (self.clients_per_request, 1),
                     "request-distribution": (self.request_distribution, "even")}
        for other, (value, default) in generator.items():
            if value != default:
                raise bad(other, value, f"{default!r} when {key} is set ({key} is the "
                          "one request; this key is for generated requests)")

    def _tokens(self) -> list[str]:
        if self.frameworks.strip().lower() == "none":
            return []
        return [f.strip() for f in self.frameworks.split(",") if f.strip()]

    @property
    def request_count(self) -> int:
        """K, the run's requests: 1 with ``forget-clients``, else ``num-requests``."""
        return 1 if self.forget_clients else self.num_requests

    @property
    def framework_list(self) -> list[str]:
        """The frameworks' names, in the given order ([] for 'none').

        Built-ins upper-case (``SE``); a ``package.module:Class`` method by its
        class name (``Class``), the name it has in summary.json and the report.
        """
        return [_name(t) for t in self._tokens()]

    @property
    def plugin_methods(self) -> dict[str, str]:
        """Name -> ``package.module:Class`` of each method of one's own."""
        return {_name(t): t for t in self._tokens() if is_plugin(t)}

    @property
    def method_infos(self) -> list[type[registry.UnlearningMethod]]:
        """The frameworks' descriptions, in the given order (plug-ins too)."""
        return [registry.info(n, self.plugin_methods) for n in self.framework_list]

    def with_fields(self, **fields) -> list[str]:
        """The frameworks whose description has these field values, in order."""
        return [m.name for m in self.method_infos
                if all(getattr(m, k) == v for k, v in fields.items())]

    @property
    def erased_records(self) -> dict[int, list[int]]:
        """``forget-records`` parsed: partition id -> record ids ({} if unset)."""
        return records.parse_records(self.forget_records)

    @property
    def erased_labels(self) -> list[int]:
        """``forget-labels`` parsed ([] if unset)."""
        return records.parse_labels(self.forget_labels)

    @property
    def forget_client_list(self) -> list[int]:
        """Explicit ``forget-clients`` as ints, in the given order ([] if unset)."""
        return [int(t) for t in self.forget_clients.split(",") if t.strip()]


def _name(token: str) -> str:
    """A ``frameworks`` entry's name: a built-in upper-case, a method its class name."""
    return token.rpartition(":")[2].rpartition(".")[2] if is_plugin(token) \
        else registry.canonical(token) or token.upper()

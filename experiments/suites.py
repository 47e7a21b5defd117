"""The experiments: which runs of the app each one makes, per suite.

Every configuration is one run of the real ServerApp / ClientApp (a
:class:`RunSpec`: run-config keys as ``--run-config`` takes them). The storage
experiment also measures storage against the number of clients C and of rounds
G with :mod:`experiments.storage` (:class:`StorageSweep`).

Experiments (Lin et al., IJCAI 2024, Sec. 5):

- ``single`` (Fig. 3 / Table 1): one request of one client; SE, FR, FE and RR on
  every dataset, IID and non-IID: accuracy (test loss for Shakespeare),
  retraining compute time, modelled wall time and client-epochs, FR's and RR's
  rounds to the original model's test loss, membership-inference F1; plus the
  MIA stability runs (one configuration over three seeds) and FE alone at
  calibration interval 2 (the headline FE runs at interval 1).
- ``concurrent`` (Fig. 4): K requests handled as one batch, spread over shards
  (``even``) or all in one shard (``adapt``), on CIFAR-10 and Shakespeare: SE's
  measured retraining beside the paper's expectation S c (1 - (1 - 1/S)^K), and
  FR, FE and RR on the same batch; and the same K requests handled one after
  another (``sequential``, SE only, expected K c).
- ``storage`` (Fig. 5): server storage and communication time of FedEraser,
  uncoded SE and coded SE; storage against C and G.

Suites (``--suite``; the same experiments at four sizes): ``quick`` (small:
seconds to minutes per run on 2 cores; the models are barely trained),
``trained`` (the quick topology with all the data and more rounds: models that
reach MNIST 97%, Fashion-MNIST 85%, CIFAR-10 45%, Tiny Shakespeare 2.3
nats/char; minutes per run), ``paper`` (the paper's topology, the run preset
presets/paper.toml: C = 100, S = 4, 20 clients a round, L = 10, G = 30; hours
per run on 2 cores) and ``tiny`` (seconds per run; the tests). A suite is not a
run preset (``./simulate.sh --preset NAME``, presets/NAME.toml): the ``quick``
suite has nothing to do with presets/quick.toml.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from pathlib import Path

from flwr.common.config import flatten_dict

from cli import config as cli_config
from experiments.facts import ExperimentFacts, facts_of
from server_app.config import methods as registry
from task.config import fused_run_config
from task.tasks import BUILTIN_TASKS

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("single", "concurrent", "storage")
COMPARED = "SE,FR,FE,RR,SISA"
"""The frameworks of a single-request run and a concurrent cell: SE, the paper's
baselines and SISA, the exact shard reference (SE's distance to it is the price of
its approximation, its distance to FR the price of isolation)."""
SUITES = ("quick", "trained", "paper", "tiny")
# Which datasets each experiment runs, their caps, extra keys, goals and costs are
# the built-in tasks' facts (experiments.facts.BUILTIN_FACTS);
# None below marks where _settings fills them in, in this order.
_NO_FACTS = ExperimentFacts()


@dataclass(frozen=True)
class RunSpec:
    """One run of the app.

    Attributes
    ----------
    experiment : str
        ``single``, ``concurrent`` or ``storage``.
    name : str
        Unique run name in the output folder (the app's ``run-name``).
    config : dict
        Run-config keys (kebab-case) of this run, without ``results-dir`` /
        ``run-name`` / ``data-dir`` (the runner adds them).
    tags : dict
        What the run varies, for tables and figures (dataset, partition, K, ...).
    weight : float
        Rough relative cost, for the time-left estimate only.
    """

    experiment: str
    name: str
    config: dict
    tags: dict
    weight: float = 1.0


@dataclass(frozen=True)
class StorageSweep:
    """Storage against clients C and rounds G (:mod:`experiments.storage`).

    Attributes
    ----------
    clients : tuple[int, ...]
        Values of C (each >= 20: k = S K = 20 data blocks a round).
    rounds : tuple[int, ...]
        Values of G (checkpoints of one max(G)-round run per C).
    """

    clients: tuple[int, ...]
    rounds: tuple[int, ...]

    experiment = "storage"

    @property
    def name(self) -> str:
        """A label for progress lines."""
        return f"storage sweep C={list(self.clients)} G={list(self.rounds)}"

    @property
    def weight(self) -> float:
        """Rough cost relative to a :class:`RunSpec`'s (time-left estimate only)."""
        return sum(c * max(self.rounds) for c in self.clients) / 750


# Per suite: the topology of each experiment, and what it sweeps (``paper``:
# presets/paper.toml, see :func:`base`).
_BASE = {
    "quick": {
        "num-shards": 4, "local-epochs": 2, "num-rounds": 4, "retrain-ratio": 2.0,
        "batch-size": 16, "test-samples": 500, "mia-samples": 300,
    },
    "tiny": {
        "num-shards": 2, "local-epochs": 1, "num-rounds": 2, "retrain-ratio": 2.0,
        "batch-size": 16, "test-samples": 200, "mia-samples": 100,
    },
    # the quick topology with every client's whole share of the data, trained until
    # the models are useful (MNIST >= 97%, Fashion-MNIST >= 85%, CIFAR-10 >= 45%,
    # Tiny Shakespeare <= 2.3 nats/char: the rounds per dataset are the tasks' facts)
    "trained": {
        "num-shards": 4, "local-epochs": 2, "num-rounds": 8, "retrain-ratio": 2.0,
        "batch-size": 32, "test-samples": 2000, "mia-samples": 1000,
    },
}
# the paper's experiments (datasets, partitions, K, the Fig. 5 storage range): the
# `quick` and `paper` suites run the same ones and differ only in their sizes; the
# sweep does no training, about 4 minutes here
_PAPER_SCOPE = {
    "single_datasets": None,
    "partitions": ("iid", "noniid"),
    "mia_seeds": (0, 1, 2), "mia_config": None,
    "concurrent_datasets": None,
    "ks": (1, 2, 4, 8), "sequential": ("even", "adapt"),
    "storage_dataset": None,
    "sweep_clients": (20, 50, 100, 200), "sweep_rounds": (10, 20, 30),
    "fe_intervals": (2,),
}
_SETTINGS = {
    "quick": {
        "single": {"num-clients": 20, "clients-per-round": 8,
                   "clients-per-request": 2},
        "concurrent": {"num-clients": 40, "clients-per-round": 8, "num-rounds": 3},
        "storage": {"num-clients": 20, "clients-per-round": 8, "local-epochs": 1},
        "client-samples": None, "dataset": None,
        **_PAPER_SCOPE,
    },
    "paper": {
        "single": {}, "concurrent": {}, "storage": {},
        "client-samples": None, "dataset": None,
        **_PAPER_SCOPE,
    },
    "trained": {
        "single": {"num-clients": 20, "clients-per-round": 8,
                   "clients-per-request": 2},
        "concurrent": {"num-clients": 40, "clients-per-round": 8},
        "storage": {"num-clients": 20, "clients-per-round": 8, "local-epochs": 1},
        "client-samples": None, "dataset": None,
        **_PAPER_SCOPE,
    },
    "tiny": {
        # MNIST non-IID needs C >= 10 (a primary class holds 80% of N / C samples)
        "single": {"num-clients": 10, "clients-per-round": 4},
        "concurrent": {"num-clients": 8, "clients-per-round": 4},
        "storage": {"num-clients": 8, "clients-per-round": 4, "blocks-per-shard": 2},
        "client-samples": None, "dataset": None,
        "single_datasets": None,
        "partitions": ("iid", "noniid"),
        "mia_seeds": (0, 1), "mia_config": None,
        "concurrent_datasets": None,
        "ks": (1, 2), "sequential": ("even",),
        "storage_dataset": None,
        "sweep_clients": (20,), "sweep_rounds": (1, 2),
        "fe_intervals": (2,),
    },
}


def _facts(dataset: str) -> ExperimentFacts:
    """A run's dataset's facts (a built-in's; none for any other task)."""
    return facts_of(dataset) or _NO_FACTS


def _builtins() -> list[tuple[str, ExperimentFacts]]:
    return [(name, _facts(name)) for name in BUILTIN_TASKS]


def _dataset_settings(suite: str) -> dict:
    """What the built-ins' facts say of ``suite``, under the keys of :data:`_SETTINGS`."""
    facts = _builtins()

    def having(role: str) -> tuple[str, ...]:
        return tuple(name for name, f in facts if role in f.roles.get(suite, ()))

    mia, storage = having("mia"), having("storage")
    return {
        "client-samples": {name: f.client_samples[suite] for name, f in facts
                           if f.client_samples.get(suite)},
        "dataset": {name: dict(f.config[suite]) for name, f in facts
                    if f.config.get(suite)},
        "single_datasets": having("single"),
        "mia_config": (mia[0], "iid") if mia else None,
        "concurrent_datasets": having("concurrent"),
        "storage_dataset": storage[0] if storage else None,
    }


def _settings(suite: str) -> dict:
    """:data:`_SETTINGS` of ``suite`` with the built-ins' facts filled in (in order)."""
    facts = _dataset_settings(suite)
    out = {}
    for key, value in _SETTINGS[suite].items():
        value = facts[key] if value is None else value
        if key != "dataset" or value:  # a suite without per-dataset keys lists none
            out[key] = value
    return out


def storage_dataset(suite: str = "paper") -> str | None:
    """The built-in task the storage experiment of ``suite`` measures (None: none)."""
    return _dataset_settings(suite)["storage_dataset"]


def quality_goal(dataset: str) -> tuple[str, float] | None:
    """What a trained model of ``dataset`` must reach: (metric, bound), or None.

    Accuracy at least, or the test loss (nats) at most; the built-in task's
    :attr:`~experiments.facts.ExperimentFacts.goal`.
    """
    return _facts(dataset).goal


def base(suite: str) -> dict:
    """The topology every run of ``suite`` shares (``paper``: presets/paper.toml)."""
    if suite == "paper":
        return cli_config.preset_values("paper")
    return dict(_BASE[suite])


def preset_training(facts: ExperimentFacts, root: Path = ROOT) -> dict:
    """A task's local-training keys from its preset (presets/NAME.toml), else defaults.

    Parameters
    ----------
    facts : ExperimentFacts
        The task's ``preset``, ``preset_keys`` and ``preset_default``.
    root : Path
        The project root.

    Returns
    -------
    dict
        Kebab-case run-config keys (``{}`` for a task without a preset).
    """
    if not facts.preset:
        return {}
    path = root / "presets" / f"{facts.preset}.toml"
    if path.is_file():
        preset = flatten_dict(tomllib.loads(path.read_text()))
        keys = {k: preset[k] for k in facts.preset_keys if k in preset}
        if keys:
            return keys
    return dict(facts.preset_default)


def text_training(root: Path = ROOT) -> dict:
    """The local-training keys every built-in with a preset takes from it (report.md)."""
    out: dict = {}
    for _, facts in _builtins():
        out.update(preset_training(facts, root))
    return out


def dataset_config(suite: str, dataset: str) -> dict:
    """Dataset-specific keys: the dataset, its sample cap, its preset's training keys."""
    facts = _facts(dataset)
    out: dict = {"dataset": dataset}
    cap = facts.client_samples.get(suite)
    if cap:
        out["client-samples"] = cap
    out.update(preset_training(facts))  # the suite's own plan: the task's preset
    out.update(facts.config.get(suite, {}))
    return out


def _weight(config: dict, frameworks: float, learnings: int) -> float:
    config = fused_run_config(config)  # unset keys: pyproject.toml's defaults
    facts = _facts(str(config["dataset"]))
    share = facts.train_size // int(config["num-clients"])
    samples = min(int(config["client-samples"]) or share, share)
    size = (int(config["clients-per-round"]) * int(config["num-rounds"])
            * int(config["local-epochs"]) * samples)
    return facts.cost * size * (learnings + 0.6 * frameworks) / 1e4


METHOD_KEYS = "method."
"""presets/paper.toml's method settings (``method.<key>.*``) make SE the paper's;
:func:`paper_cell` drops them."""


def paper_cell(dataset: str, seed: int = 0, partition: str = "noniid") -> dict:
    """The ``paper`` suite's single-request config of ``dataset``, SE as it ships.

    C = 100, S = 4, 20 clients a round, L = 10, G = 30 (presets/paper.toml), one
    request of one client; the preset's method settings (:data:`METHOD_KEYS`)
    dropped, so SE and SE-R run with the shipped defaults.

    Raises
    ------
    StopIteration
        The suite has no ``partition`` cell of ``dataset``.
    """
    spec = next(s for s in single_runs("paper", (dataset,))
                if s.tags.get("partition") == partition and s.tags.get("seed") == 0
                and s.name.startswith("single-"))
    return {**{k: v for k, v in spec.config.items() if not k.startswith(METHOD_KEYS)},
            "seed": seed}


def single_runs(suite: str, datasets: tuple[str, ...] | None = None) -> list[RunSpec]:
    """Fig. 3 / Table 1 and the MIA stability runs.

    One request of one client (the generator's ``even`` draw); frameworks SE,
    FR, FE, RR; MIA on. The MIA-stability configuration repeats with the other
    seeds (its seed-0 run is the grid's own).
    """
    st = _settings(suite)
    runs = []
    for dataset in datasets or st["single_datasets"]:
        for partition in st["partitions"]:
            seeds = st["mia_seeds"] if (dataset, partition) == st["mia_config"] else (0,)
            for seed in seeds:
                config = {**base(suite), **st["single"],
                          **dataset_config(suite, dataset), "partition": partition,
                          "seed": seed,
                          "frameworks": COMPARED, "num-requests": 1,
                          "clients-per-request": st["single"].get(
                              "clients-per-request", 1), "mia": True}
                name = f"single-{dataset}-{partition}-s{seed}"
                runs.append(RunSpec("single", name, config, {
                    "dataset": dataset, "partition": partition, "seed": seed,
                    "mia_stability": (dataset, partition) == st["mia_config"]},
                    _weight(config, 4, 2)))
            runs += _fe_interval_runs(suite, dataset, partition)
    return runs


def _fe_interval_runs(suite: str, dataset: str, partition: str) -> list[RunSpec]:
    """FE alone at the suite's other calibration intervals.

    FedEraser's paper advertises its speed-up at interval 2; the headline FE
    is interval 1.
    """
    st = _settings(suite)
    runs = []
    for interval in st.get("fe_intervals", ()):
        config = {**base(suite), **st["single"], **dataset_config(suite, dataset),
                  "partition": partition, "seed": 0, "frameworks": "FE",
                  "num-requests": 1, "calibration-interval": interval,
                  "clients-per-request": st["single"].get("clients-per-request", 1),
                  "mia": False}
        runs.append(RunSpec("single", f"single-{dataset}-{partition}-s0-fe{interval}",
                            config, {"dataset": dataset, "partition": partition,
                                     "seed": 0, "fe_interval": interval,
                                     "mia_stability": False},
                            _weight(config, 1, 1)))
    return runs


def concurrent_runs(suite: str, datasets: tuple[str, ...] | None = None
                    ) -> list[RunSpec]:
    """Fig. 4: K concurrent requests (even, adapt) and sequential ones.

    Concurrent runs run SE, FR, FE and RR (the paper's "70% less time in the
    even case" compares them); sequential runs SE only.

    Sequential runs use the largest K: request k of a sequential run is handled
    alone from the stored history, so its first k requests give the sequential
    cost of k requests.
    """
    st = _settings(suite)
    runs = []
    for dataset in datasets or st["concurrent_datasets"]:
        for distribution in ("even", "adapt"):
            modes = [("concurrent", k) for k in st["ks"]]
            if distribution in st["sequential"]:
                modes.append(("sequential", max(st["ks"])))
            for mode, k in modes:
                config = {**base(suite), **st["concurrent"],
                          **dataset_config(suite, dataset), "partition": "iid",
                          "seed": 0, "num-requests": k,
                          "frameworks": COMPARED if mode == "concurrent" else "SE",
                          "clients-per-request": 1, "request-distribution": distribution,
                          "request-mode": mode, "mia": False}
                runs.append(RunSpec(
                    "concurrent", f"concurrent-{dataset}-{distribution}-{mode}-k{k}",
                    config, {"dataset": dataset, "distribution": distribution,
                             "mode": mode, "K": k},
                    _weight(config, 0.3 * k + 3 if mode == "concurrent" else 0.3 * k,
                            2 if mode == "concurrent" else 1)))
    return runs


def storage_runs(suite: str) -> list[RunSpec]:
    """Fig. 5 (communication, storage): FE beside uncoded and coded SE, one request."""
    st = _settings(suite)
    runs = []
    if st["storage_dataset"] is None:  # no built-in runs the storage experiment
        return runs
    for storage in ("uncoded", "coded"):
        config = {**base(suite), **st["storage"],
                  **dataset_config(suite, st["storage_dataset"]), "partition": "iid",
                  "seed": 0, "frameworks": "SE,FE", "num-requests": 1,
                  "clients-per-request": 1, "storage": storage, "mia": False}
        runs.append(RunSpec("storage", f"storage-{st['storage_dataset']}-{storage}",
                            config, {"dataset": st["storage_dataset"],
                                     "storage": storage}, _weight(config, 1, 2)))
    return runs


def storage_sweep(suite: str) -> StorageSweep:
    """Storage against C and G (no training; :mod:`experiments.storage`)."""
    st = _settings(suite)
    return StorageSweep(tuple(st["sweep_clients"]), tuple(st["sweep_rounds"]))


def plan(experiment: str, suite: str, datasets: tuple[str, ...] | None = None
         ) -> list[RunSpec]:
    """The app runs of ``experiment`` (``all``: every experiment in order).

    Raises
    ------
    ValueError
        Unknown experiment or suite.
    """
    if suite not in SUITES:
        raise ValueError(f"suite {suite!r}: one of {', '.join(SUITES)}")
    if experiment == "all":
        return [r for e in EXPERIMENTS for r in plan(e, suite, datasets)]
    if experiment == "single":
        return single_runs(suite, datasets)
    if experiment == "concurrent":
        return concurrent_runs(suite, datasets)
    if experiment == "storage":
        return storage_runs(suite)
    raise ValueError(f"experiment {experiment!r}: one of {', '.join(EXPERIMENTS)}, all")


def with_methods(specs: list[RunSpec], methods: tuple[str, ...]) -> list[RunSpec]:
    """``specs`` with more unlearning methods run beside SE.

    Every run whose ``frameworks`` includes SE also runs ``methods``: methods of
    one's own (``package.module:Class``, :mod:`server_app.unlearning.methods`) or
    built-in frameworks it lacks (e.g. ``SE-R``, ``FRec``), so they land in
    results.csv, the tables and the figures beside SE and the baselines; its name
    gains ``-with-<Class or name>...`` (a run without them is never reused for it).
    A method the run already has is not added twice.

    Raises
    ------
    ValueError
        One line: a method the run config's ``frameworks`` check refuses (an
        unknown name, a malformed or unimportable ``package.module:Class``),
        before any run.
    """
    if not methods:
        return list(specs)
    _check_methods(methods)
    tail = "-with-" + "-".join(m.rpartition(":")[2].rpartition(".")[2] for m in methods)
    out = []
    for spec in specs:
        names = str(spec.config.get("frameworks", "")).split(",")
        if registry.proposed() not in names:
            out.append(spec)
            continue
        have = {registry.canonical(n) or n for n in names}
        extra = [m for m in (registry.canonical(m) or m for m in methods)
                 if m not in have]
        config = {**spec.config, "frameworks": ",".join([*names, *extra])}
        out.append(replace(spec, name=spec.name + tail, config=config))
    return out


def _check_methods(methods: tuple[str, ...]) -> None:
    """Raise ValueError (one line) where ``frameworks`` = SE plus ``methods`` is refused.

    As a run's launcher checks it: a plug-in method must import and be a method.
    """
    from server_app.config import ConfigError
    from server_app.preflight import validate_run_config

    frameworks = ",".join([registry.proposed(), *methods])
    try:
        validate_run_config(fused_run_config({"frameworks": frameworks}), files=False)
    except ConfigError as err:
        line = str(err).splitlines()[0]
        raise ValueError(f"--methods {','.join(methods)!r}: {line}") from None


def select(specs: list[RunSpec], only: tuple[str, ...]) -> list[RunSpec]:
    """The runs of ``specs`` whose name matches one of the ``only`` patterns.

    Patterns are shell-style (``fnmatch``, case-sensitive), e.g.
    ``*-noniid-s0-with-*``; no pattern keeps every run.

    Raises
    ------
    ValueError
        A pattern matches none of the runs (it names the pattern and the runs).
    """
    if not only:
        return list(specs)
    names = [s.name for s in specs]
    for pattern in only:
        if not any(fnmatchcase(name, pattern) for name in names):
            raise ValueError(f"--only {pattern!r} matches none of the runs: "
                             f"{', '.join(names) or 'none planned'}")
    return [s for s in specs if any(fnmatchcase(s.name, p) for p in only)]


def suite_settings(suite: str) -> dict:
    """What the suite sweeps and fixes (for report.md)."""
    return {"base": base(suite), **_settings(suite), "text-training": text_training()}

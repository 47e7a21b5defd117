"""The unlearning methods: one description each, read by every part of the app.

A method is described once, here, by a :class:`MethodInfo`: how it is built (a
``package.module:function`` builder, resolved by the unlearning stage through the
same import door as a user's ``package.module:Class`` method), which federation it
runs on, whether it reads stored history, whether it is exact, what stages and the
audits may ask of it, and its label and colour in the figures. The driver, request
planning, the run-config checks, the audits, the experiments and the report read
these fields; no other module lists or branches on a method's name
(``tests/test_layout.py`` checks it).

Adding a built-in method is one module holding its builder (under
``server_app/unlearning/builtin/``) and one :func:`register` line below
(docs/DEVELOPING.md, "Adding a built-in unlearning method").
"""

from __future__ import annotations

from dataclasses import dataclass

FEDERATIONS = ("shards", "baseline")
STAGED_ROLES = ("", "serves", "retrains")


@dataclass(frozen=True, kw_only=True)
class MethodInfo:
    """What the app asks of one unlearning method.

    Attributes
    ----------
    name : str
        Its name in run-config ``frameworks`` (any case), summary.json, the report
        and the experiment CSV.
    builder : str
        ``package.module:function`` taking a
        :class:`server_app.unlearning.frameworks.BuildCall` and returning a
        :class:`server_app.unlearning.frameworks.Framework`.
    federation : str
        ``shards``: SE's S isolated shards (reads SE's stored history, coded or
        not, and pays a coded slice retrieval); ``baseline``: the
        ``baseline-shards`` federation, which learns beside SE when one runs.
    reads_history : bool
        Reads its federation's stored training updates (its server storage is
        that history's bytes; a baseline method with history makes the baseline
        federation record one). A method that reads only who trained when
        (the participation record) does not.
    exact : bool
        Its model never depended on the forgotten clients' data (a retraining
        from W^0): the U-LiRA audit needs no reference for it.
    from_scratch : bool
        Retrains from W^0 with learning's sampling budget: rounds-to-target is
        watched and a baseline shard left with fewer clients than it sampled is
        noted before the run.
    calibrated : bool
        Replays stored rounds with FedEraser's calibration interval (paper
        eq. 2-3): the U-LiRA references, which replay every round, need
        ``calibration-interval = 1``.
    replay_report : bool
        Reports SE's replay accounting: rounds replayed, the paper's expected
        cost (Sec. 4.2), the impacted shards in the experiment rows; when every
        request was a no-op its learned models stand as its result.
    paper_baseline : bool
        The paper compares SE's savings against it (the reduction columns of
        the experiment report).
    interval_label : bool
        Its experiment row is named ``NAME(dt=n)`` at ``calibration-interval`` n
        != 1 (FedEraser's interval ablation), so the headline row keeps n = 1.
    ulira : str
        The function of :mod:`server_app.evaluation.reference_unlearning` with
        which the U-LiRA references unlearn like it (``""``: not referenced).
    refill_key : str
        The run-config key that refills its forgotten clients' slots (``""``:
        none), named in the audit's recipe.
    staged : str
        ``serves``: the method a staged run forgets with (its models carry on);
        ``retrains``: retrained beside it at each boundary for comparison;
        ``""``: not in staged runs or later requests.
    erases_records : bool
        Takes records and class-level requests (``forget-records``,
        ``forget-labels``): it retrains the changed clients' shards from a point
        before their first participation with those clients training on what
        they keep, so no erased record reaches its model (SE, SISA, FR, RR). A
        method that assumes the retained clients' data never changed (FedEraser's
        stored-norm calibration of the unsharded history, FedRecover's estimates)
        does not.
    colour : str
        Its colour in the figures (matplotlib).
    summary : str
        One line for the docs: what it is and its source.
    """

    name: str
    builder: str
    federation: str = "shards"
    reads_history: bool = True
    exact: bool = False
    from_scratch: bool = False
    calibrated: bool = False
    replay_report: bool = False
    paper_baseline: bool = False
    interval_label: bool = False
    ulira: str = ""
    refill_key: str = ""
    staged: str = ""
    erases_records: bool = False
    colour: str = "#8c564b"
    summary: str = ""
    plugin: str = ""
    """``package.module:Class`` of a user's method (``""`` for a built-in)."""

    def __post_init__(self) -> None:
        if self.federation not in FEDERATIONS:
            raise ValueError(f"method {self.name!r}: federation {self.federation!r} "
                             f"is not one of {', '.join(FEDERATIONS)}")
        if self.staged not in STAGED_ROLES:
            raise ValueError(f"method {self.name!r}: staged {self.staged!r} is not "
                             f"one of {', '.join(map(repr, STAGED_ROLES))}")

    @property
    def on_baseline(self) -> bool:
        """Runs on the baseline federation (its original is ``baseline_learning``)."""
        return self.federation == "baseline"


PLUGIN_BUILDER = "server_app.unlearning.frameworks:build_plugin"
"""The builder of every ``package.module:Class`` method of one's own."""

_REGISTRY: dict[str, MethodInfo] = {}


def register(info: MethodInfo) -> MethodInfo:
    """Add a built-in method; its name must be new in any case.

    Raises
    ------
    ValueError
        The name (in any case) is taken, or is ``original`` (the learned model).
    """
    taken = {n.upper() for n in (*_REGISTRY, "original")}
    if info.name.upper() in taken:
        raise ValueError(f"method name {info.name!r} is taken "
                         f"({', '.join((*_REGISTRY, 'original'))})")
    _REGISTRY[info.name] = info
    return info


def unregister(name: str) -> None:
    """Remove a registered method (tests register temporary ones)."""
    _REGISTRY.pop(name, None)


def builtins() -> tuple[MethodInfo, ...]:
    """The registered methods, in registration order (the report's order)."""
    return tuple(_REGISTRY.values())


def names() -> tuple[str, ...]:
    """The registered methods' names, in registration order."""
    return tuple(_REGISTRY)


def registered(name: str) -> MethodInfo | None:
    """The built-in named exactly ``name``, or None (a plug-in, ``original``, ...)."""
    return _REGISTRY.get(name)


def has(name: str, field: str) -> bool:
    """The built-in ``name``'s description has ``field`` true.

    False for a plug-in, ``original`` or any other name not registered.
    """
    described = _REGISTRY.get(name)
    return bool(described and getattr(described, field))


def canonical(token: str) -> str | None:
    """A built-in's own spelling of ``token`` in any case (``frec`` -> ``FRec``)."""
    return next((n for n in _REGISTRY if n.upper() == token.upper()), None)


def plugin_info(name: str, spec: str) -> MethodInfo:
    """The description of a user's ``package.module:Class`` method named ``name``.

    It runs on SE's shards, reads SE's stored history and is approximate; stages,
    later requests and the U-LiRA references do not take it.
    """
    return MethodInfo(name=name, builder=PLUGIN_BUILDER, plugin=spec,
                      summary=f"a method of one's own ({spec})")


def info(name: str, plugins: dict[str, str] | None = None) -> MethodInfo:
    """The description of the method ``name`` (a built-in, or one of ``plugins``).

    Raises
    ------
    KeyError
        No built-in or plug-in of that name.
    """
    if plugins and name in plugins:
        return plugin_info(name, plugins[name])
    if name in _REGISTRY:
        return _REGISTRY[name]
    raise KeyError(f"unknown unlearning method {name!r}: one of {', '.join(_REGISTRY)}")


def with_role(staged: str) -> MethodInfo:
    """The built-in whose ``staged`` role is ``staged`` (``serves`` / ``retrains``).

    Raises
    ------
    LookupError
        No registered method has that role.
    """
    found = next((m for m in _REGISTRY.values() if m.staged == staged), None)
    if found is None:
        raise LookupError(f"no registered method has staged role {staged!r}")
    return found


def proposed() -> str:
    """The method this app exists for (the one staged runs forget with)."""
    return with_role("serves").name


def reference() -> str:
    """The yardstick every comparison is made against (a full retraining)."""
    return with_role("retrains").name


def shard_reference() -> str:
    """The exact method on SE's shards: the yardstick of SE's approximation.

    Its distance to :func:`reference` is the price of isolation, SE's distance to
    it the price of approximation.
    """
    found = next((m for m in _REGISTRY.values() if m.exact and not m.on_baseline), None)
    if found is None:
        raise LookupError("no registered method is exact on SE's shards")
    return found.name


_UNLEARNING = "server_app.unlearning.builtin"

register(MethodInfo(
    name="SE", builder=f"{_UNLEARNING}.sharding_eraser:build", calibrated=True,
    replay_report=True, ulira="se_unlearn", refill_key="replay-refill", staged="serves",
    erases_records=True, colour="#d62728",
    summary="Sharding Eraser: calibrated replay of the impacted shards (the paper)"))
register(MethodInfo(
    name="FR", builder=f"{_UNLEARNING}.retrain:fed_retrain", federation="baseline",
    reads_history=False, exact=True, from_scratch=True, staged="retrains",
    paper_baseline=True, erases_records=True,
    colour="#1f77b4", summary="FedRetrain: retrain the federation from W^0"))
register(MethodInfo(
    name="FE", builder=f"{_UNLEARNING}.fed_eraser:build", federation="baseline",
    calibrated=True, interval_label=True, ulira="se_unlearn", paper_baseline=True,
    colour="#2ca02c",
    summary="FedEraser (Liu et al. 2021): calibrated replay from round 1"))
register(MethodInfo(
    name="RR", builder=f"{_UNLEARNING}.retrain:rapid_retrain", federation="baseline",
    reads_history=False, exact=True, from_scratch=True, paper_baseline=True,
    erases_records=True, colour="#9467bd",
    summary="RapidRetrain (Liu et al. 2022): FedRetrain, Fisher-preconditioned local SGD"))
register(MethodInfo(
    name="SE-R", builder=f"{_UNLEARNING}.recovery:build", ulira="recover",
    refill_key="recovery-refill", colour="#e377c2",
    summary="SE with FedRecover's server-side recovery on the impacted shards"))
register(MethodInfo(
    name="FRec", builder=f"{_UNLEARNING}.recovery:build", federation="baseline",
    ulira="recover", colour="#17becf",
    summary="FedRecover (Cao et al. 2023): server-side recovery of the federation"))
register(MethodInfo(
    name="SISA", builder=f"{_UNLEARNING}.shard_retrain:build", reads_history=False,
    exact=True, erases_records=True, colour="#bcbd22",
    summary="exact shard retraining (SISA, one slice): each impacted shard from W^0"))

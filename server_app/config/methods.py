"""The unlearning methods: one class each, read by every part of the app.

A method is one :class:`UnlearningMethod` subclass in its own module (the
built-ins in ``server_app/unlearning/builtin/``): its description as class
attributes (only the facts that differ from the base's defaults), and
``build(request)``, which turns one request into the Flower strategy that runs it.
This registry names each built-in by ``package.module:Class`` and imports it the
first time it is asked about, through the same door as a user's method
(:func:`task.registry.import_object`). The driver, request planning, the
run-config checks, the audits, the experiments and the report read the classes'
attributes; no other module lists or branches on a method's name
(``tests/test_layout.py`` checks it).

Adding a built-in method is one module holding its class and one :func:`register`
line below (docs/DEVELOPING.md, "Adding a built-in unlearning method").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from task.registry import import_object
from task.section import Section
from task.values import bad

PREFIX = "method."
"""The first part of every method's own run-config key: ``method.<key>.<field>``."""


@dataclass(frozen=True)
class MethodSettings(Section):
    """A method's own settings, read from its run-config keys ``method.<key>.<field>``.

    A method declares its settings as a frozen dataclass subclass of this one
    (fields with defaults, ``validate`` for their ranges); the keys are
    namespaced as Flower baselines namespace theirs (a ``[method.se]`` table in
    ``pyproject.toml`` flattens to ``method.se.calibration-final``). The base
    has no field: a method without settings of its own.
    """

    prefix: ClassVar[str] = ""
    """``<key>`` of the method the class belongs to (set by :class:`UnlearningMethod`)."""

    @classmethod
    def keys(cls) -> dict[str, str]:
        """Run-config key (``method.<key>.<field>``) -> field name, in field order."""
        return {f"{PREFIX}{cls.prefix}.{f.name.replace('_', '-')}": f.name
                for f in dataclasses.fields(cls)}

    def key(self, name: str) -> str:
        """The run-config key of field ``name``."""
        return f"{PREFIX}{self.prefix}.{name.replace('_', '-')}"

    def refuse(self, name: str, allowed: str) -> Exception:
        """The one-line :class:`ConfigError` for field ``name``'s value."""
        return bad(self.key(name), getattr(self, name), allowed)

    def validate(self) -> None:
        """Raise :class:`ConfigError` on the first bad value (none in the base)."""

FEDERATIONS = ("shards", "baseline")
STAGED_ROLES = ("", "serves", "retrains")


class UnlearningMethod:
    """One unlearning method: what the app may ask of it, and how it is built.

    Subclasses set the class attributes that differ from these defaults and
    implement :meth:`build`. The attributes are read off the class; no instance
    is made.

    Attributes
    ----------
    name : str
        Its name in run-config ``frameworks`` (any case), summary.json, the report
        and the experiment CSV.
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
        eq. 2-3).
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
    plugin : str
        ``package.module:Class`` of a user's ``ShardedStrategy`` method
        (``""`` for a method class).
    Settings : type[MethodSettings]
        Its own settings (the base: none), read from ``method.<key>.<field>``.
    key : str
        ``<key>`` of those run-config keys (default: ``name`` in lower case).
    renamed : dict[str, str]
        Flat run-config keys its settings had before they were namespaced ->
        the field each became: a run that sets one is refused with the new key.
    on_baseline : bool
        Runs on the baseline federation (its original is ``baseline_learning``);
        set from ``federation``.
    referenced : bool or None
        Whether U-LiRA references it, its references unlearning with the
        method's own strategy (:mod:`server_app.stages.references`); None (the
        default): when it is not ``exact`` (an exact method's model never
        depends on the forgotten samples, so its game is chance). Read it with
        :meth:`is_referenced`; a class sets it False to opt out, and its
        subclasses inherit that. An ``exact`` method cannot opt in: the audit
        reports it as exact by construction.

    Raises
    ------
    ValueError
        On subclassing: ``federation`` or ``staged`` is not one of its values,
        or an ``exact`` method sets ``referenced = True``.
    """

    name: ClassVar[str] = ""
    federation: ClassVar[str] = "shards"
    reads_history: ClassVar[bool] = True
    exact: ClassVar[bool] = False
    from_scratch: ClassVar[bool] = False
    calibrated: ClassVar[bool] = False
    replay_report: ClassVar[bool] = False
    paper_baseline: ClassVar[bool] = False
    interval_label: ClassVar[bool] = False
    refill_key: ClassVar[str] = ""
    staged: ClassVar[str] = ""
    erases_records: ClassVar[bool] = False
    colour: ClassVar[str] = "#8c564b"
    summary: ClassVar[str] = ""
    plugin: ClassVar[str] = ""
    on_baseline: ClassVar[bool] = False
    referenced: ClassVar[bool | None] = None
    Settings: ClassVar[type[MethodSettings]] = MethodSettings
    key: ClassVar[str] = ""
    renamed: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.key = cls.__dict__.get("key") or cls.name.lower()
        if "Settings" in cls.__dict__:
            cls.Settings.prefix = cls.key
        if cls.federation not in FEDERATIONS:
            raise ValueError(f"method {cls.name!r}: federation {cls.federation!r} "
                             f"is not one of {', '.join(FEDERATIONS)}")
        if cls.staged not in STAGED_ROLES:
            raise ValueError(f"method {cls.name!r}: staged {cls.staged!r} is not "
                             f"one of {', '.join(map(repr, STAGED_ROLES))}")
        if cls.exact and cls.referenced:
            raise ValueError(f"method {cls.name!r}: exact = True and referenced = True; "
                             "an exact method's model never saw the forgotten data, "
                             "so U-LiRA reports it as exact by construction: leave "
                             "referenced unset")
        cls.on_baseline = cls.federation == "baseline"

    @classmethod
    def is_referenced(cls) -> bool:
        """Whether U-LiRA references the method (:attr:`referenced`)."""
        return not cls.exact if cls.referenced is None else cls.referenced

    @classmethod
    def build(cls, request: Any) -> Any:
        """The Flower strategy, start models and rounds that forget ``request``.

        ``request`` is a :class:`server_app.unlearning.frameworks.Request`, the
        result a :class:`server_app.unlearning.frameworks.Framework` (that wing
        sits above this one, so neither is imported here).

        Raises
        ------
        ValueError
            A request the method cannot serve (FE without a baseline history, ...).
        """
        raise NotImplementedError(f"method {cls.name!r} has no build")


_REGISTRY: dict[str, type[UnlearningMethod] | str] = {}
"""Name -> its class, or the ``package.module:Class`` not imported yet."""


def register(name: str, method: type[UnlearningMethod] | str) -> None:
    """Add a built-in method: its class, or its ``package.module:Class``.

    Raises
    ------
    ValueError
        The name (in any case) is taken, or is ``original`` (the learned model).
    """
    taken = {n.upper() for n in (*_REGISTRY, "original")}
    if name.upper() in taken:
        raise ValueError(f"method name {name!r} is taken "
                         f"({', '.join((*_REGISTRY, 'original'))})")
    _REGISTRY[name] = method


def _resolved(name: str) -> type[UnlearningMethod]:
    """The class registered as ``name``, imported on first use."""
    method = _REGISTRY[name]
    if isinstance(method, str):
        method = import_object(method, "frameworks", builtin=True)
        if not (isinstance(method, type) and issubclass(method, UnlearningMethod)
                and method.name == name):
            raise TypeError(f"{_REGISTRY[name]} is not the UnlearningMethod {name!r}")
        _REGISTRY[name] = method
    return method


def unregister(name: str) -> None:
    """Remove a registered method (tests register temporary ones)."""
    _REGISTRY.pop(name, None)


def builtins() -> tuple[type[UnlearningMethod], ...]:
    """The registered methods, in registration order (the report's order)."""
    return tuple(_resolved(n) for n in _REGISTRY)


def names() -> tuple[str, ...]:
    """The registered methods' names, in registration order."""
    return tuple(_REGISTRY)


def registered(name: str) -> type[UnlearningMethod] | None:
    """The built-in named exactly ``name``, or None (a plug-in, ``original``, ...)."""
    return _resolved(name) if name in _REGISTRY else None


def has(name: str, field: str) -> bool:
    """The built-in ``name``'s description has ``field`` true.

    False for a plug-in, ``original`` or any other name not registered.
    """
    described = registered(name)
    return bool(described and getattr(described, field))


def canonical(token: str) -> str | None:
    """A built-in's own spelling of ``token`` in any case (``frec`` -> ``FRec``)."""
    return next((n for n in _REGISTRY if n.upper() == token.upper()), None)


def plugin_info(name: str, spec: str) -> type[UnlearningMethod]:
    """The description of a user's ``package.module:Class`` method named ``name``.

    It runs on SE's shards, reads SE's stored history and is approximate (so
    U-LiRA references it with its own strategy); stages and later requests do
    not take it.
    """
    return type(name, (UnlearningMethod,), {
        "name": name, "plugin": spec, "summary": f"a method of one's own ({spec})"})


def info(name: str, plugins: dict[str, str] | None = None) -> type[UnlearningMethod]:
    """The description of the method ``name`` (a built-in, or one of ``plugins``).

    Raises
    ------
    KeyError
        No built-in or plug-in of that name.
    """
    if plugins and name in plugins:
        return plugin_info(name, plugins[name])
    if name in _REGISTRY:
        return _resolved(name)
    raise KeyError(f"unknown unlearning method {name!r}: one of {', '.join(_REGISTRY)}")


def with_role(staged: str) -> type[UnlearningMethod]:
    """The built-in whose ``staged`` role is ``staged`` (``serves`` / ``retrains``).

    Raises
    ------
    LookupError
        No registered method has that role.
    """
    found = next((m for m in builtins() if m.staged == staged), None)
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
    found = next((m for m in builtins() if m.exact and not m.on_baseline), None)
    if found is None:
        raise LookupError("no registered method is exact on SE's shards")
    return found.name


def settings_of(run_config: Mapping[str, object]) -> dict[str, MethodSettings]:
    """Each built-in's own settings from ``run_config`` (absent keys: defaults).

    Raises
    ------
    ConfigError
        One line naming the key: a value of the wrong type or out of range, a
        ``method.`` key no method has, or a flat key that was renamed.
    """
    known: dict[str, str] = {}
    out, renamed = {}, renamed_keys()
    for method in builtins():
        out[method.name] = method.Settings.from_run_config(run_config)
        out[method.name].validate()
        known.update(dict.fromkeys(method.Settings.keys(), method.name))
    for key, value in run_config.items():
        if key.startswith(PREFIX) and key not in known:
            raise bad(key, value, f"a method's setting: {', '.join(known) or 'none'}")
        if key in renamed:
            raise bad(key, value, f"renamed: set {' and '.join(renamed[key])}")
    return out


def renamed_keys() -> dict[str, list[str]]:
    """Each flat key a built-in's settings replaced -> the namespaced keys now."""
    out: dict[str, list[str]] = {}
    for method in builtins():
        for old, name in method.renamed.items():
            out.setdefault(old, []).append(
                f"{PREFIX}{method.key}.{name.replace('_', '-')}")
    return out


def in_current_keys(config: Mapping[str, object]) -> dict[str, object]:
    """A run's recorded config in today's keys.

    Each renamed flat key's value goes under every namespaced key it became
    (:func:`renamed_keys`); the other keys stay as they are.

    For rerunning a run recorded before the settings were namespaced (the cost-only
    remakes of :mod:`experiments.remodel`); a run typed today with an old key is
    refused instead (:mod:`cli.config`).
    """
    renamed = renamed_keys()
    out = {k: v for k, v in config.items() if k not in renamed}
    for old, value in config.items():
        for new in renamed.get(old, ()):
            out.setdefault(new, value)
    return out


_BUILTIN = "server_app.unlearning.builtin"

register("SE", f"{_BUILTIN}.sharding_eraser:ShardingEraserMethod")
register("FR", f"{_BUILTIN}.retrain:FedRetrainMethod")
register("FE", f"{_BUILTIN}.fed_eraser:FedEraserMethod")
register("RR", f"{_BUILTIN}.retrain:RapidRetrainMethod")
register("SE-R", f"{_BUILTIN}.recovery:ShardRecoveryMethod")
register("FRec", f"{_BUILTIN}.recovery:FedRecoverMethod")
register("SISA", f"{_BUILTIN}.shard_retrain:ShardRetrainMethod")

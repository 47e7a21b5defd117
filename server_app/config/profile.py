"""Device profiles: what one sample of training, one transfer and one server step cost.

A device profile is a TOML file (the shipped ones in ``server_app/config/
device_profiles/``, or a user's own path) naming, per task (:attr:`task.interface.
Task.name`), the seconds one training sample and one Fisher sample take on a kind
of device, the link's base delay (and, optionally, its rate), the server's
per-parameter costs and how many clients straggle. The modelled times of a run
(:mod:`server_app.rounds.costs`) are computed from it, never from the machine's
clock, so the same run config gives the same modelled seconds whatever the load.

A profile is either measured (``benchmarks/calibrate_profile.py`` writes one, with
the machine, command and commit it ran) or derived from another (``base = "NAME"``
with ``[scale]`` factors: an assumed device, labelled ``measured = false``). Its
:attr:`DeviceProfile.digest` is the SHA-256 of its resolved contents, recorded in
summary.json (``cost_model``) beside its name. docs/DESIGN.md, "The cost model".
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: Flower's own dependency
    import tomli as tomllib

PROFILE_DIR = Path(__file__).resolve().parent / "device_profiles"
"""Where the shipped profiles are (``<name>.toml``)."""

DEFAULT_PROFILE = "cpu-core"
"""The profile run-config ``device-profile = ""`` means: this machine's calibrated core."""

CALIBRATE_COMMAND = "python benchmarks/calibrate_profile.py"
"""The command that measures a profile (``--tasks SPEC,...`` for a plug-in)."""

SERVER_KEYS = ("configure_s_per_param", "aggregate_s_per_param", "decode_s_per_op")
TASK_KEYS = ("train_s_per_sample", "fisher_s_per_sample")
FALLBACK_KEYS = ("train_s_per_param_sample", "fisher_s_per_param_sample")


class ProfileError(ValueError):
    """A device profile that cannot be read, or a value out of range (one line)."""


@dataclass(frozen=True)
class TaskCost:
    """Seconds of one task's local work on a device.

    Attributes
    ----------
    train_s_per_sample : float
        Seconds to train on one sample once (one sample of one local epoch,
        forward and backward pass and optimizer step, at the calibration's
        batch size), > 0.
    fisher_s_per_sample : float
        Seconds of one per-sample gradient of RapidRetrain's Fisher estimate, >= 0.
    """

    train_s_per_sample: float
    fisher_s_per_sample: float


@dataclass(frozen=True)
class Stragglers:
    """Which clients straggle: a seeded fraction, slower by a factor.

    Attributes
    ----------
    fraction : float
        Expected share of clients that straggle, in [0, 1].
    slowdown : float
        Factor (>= 1) on a straggler's training seconds.
    seed : int
        Seeds the draw; a client straggles or not by its partition id alone.
    """

    fraction: float = 0.0
    slowdown: float = 1.0
    seed: int = 0

    def factor(self, partition: int) -> float:
        """``slowdown`` if client ``partition`` straggles, else 1.0 (deterministic).

        Client p straggles when the first uniform draw of
        ``numpy.random.default_rng([seed, p])`` is below ``fraction``: the same
        clients straggle in every run, round and framework.
        """
        if self.fraction <= 0 or self.slowdown == 1.0:
            return 1.0
        draw = np.random.default_rng([self.seed, int(partition)]).random()
        return self.slowdown if draw < self.fraction else 1.0


@dataclass(frozen=True)
class DeviceProfile:
    """A resolved device profile (see the module docstring; units: seconds, Mbit/s).

    Attributes
    ----------
    name, description : str
        What the profile is; ``description`` says whether it was measured.
    measured : bool
        True when ``benchmarks/calibrate_profile.py`` measured it; False for an
        assumed device (a derived profile).
    tasks : Mapping[str, TaskCost]
        Task name -> its per-sample costs.
    fallback : Mapping[str, float]
        ``train_s_per_param_sample`` and ``fisher_s_per_param_sample``: seconds per
        model parameter and sample, the estimate for a task the profile lacks.
    base_delay_s : float
        Fixed seconds of one transfer (the paper's Sec. 5: 0.1).
    link_rate_mbps : float or None
        The devices' link rate; None: the run's ``link-rate-mbps``.
    server : Mapping[str, float]
        ``configure_s_per_param`` (seconds per parameter of each model sent),
        ``aggregate_s_per_param`` (per parameter of each update combined:
        averaging, calibration, estimation) and ``decode_s_per_op`` (per
        multiply-add of coded decoding: slice values x blocks).
    stragglers : Stragglers
        Which clients are slower, and by how much.
    calibration : Mapping[str, object]
        How a measured profile was made (machine, command, commit, date, ...).
    digest : str
        SHA-256 (hex) of the resolved profile.
    source : str
        The file it was read from.
    """

    name: str
    description: str
    measured: bool
    tasks: Mapping[str, TaskCost]
    fallback: Mapping[str, float]
    base_delay_s: float
    link_rate_mbps: float | None
    server: Mapping[str, float]
    stragglers: Stragglers = field(default_factory=Stragglers)
    calibration: Mapping[str, object] = field(default_factory=dict)
    digest: str = ""
    source: str = ""

    def task_cost(self, task: str, parameters: int) -> tuple[TaskCost, bool]:
        """The per-sample costs of ``task``: (costs, whether they are estimated).

        A task the profile lacks is estimated from its model's ``parameters``
        x the profile's ``fallback`` seconds per parameter and sample (and
        flagged: summary.json ``cost_model.estimated``).
        """
        if task in self.tasks:
            return self.tasks[task], False
        return TaskCost(parameters * self.fallback["train_s_per_param_sample"],
                        parameters * self.fallback["fisher_s_per_param_sample"]), True


def shipped_profiles() -> list[str]:
    """Names of the shipped profiles, sorted."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def profile_path(spec: str) -> Path:
    """The file ``spec`` names: ``""`` (the default), a shipped name, or a path.

    Raises
    ------
    ProfileError
        Neither a shipped name nor an existing ``.toml`` file.
    """
    spec = spec or DEFAULT_PROFILE
    if spec in shipped_profiles():
        return PROFILE_DIR / f"{spec}.toml"
    path = Path(spec).expanduser()
    if path.suffix == ".toml" and path.is_file():
        return path
    raise ProfileError(f"'' (the calibrated {DEFAULT_PROFILE}), one of "
                       f"{', '.join(shipped_profiles())}, or the path of an existing "
                       "profile .toml file (docs/DESIGN.md, \"The cost model\")")


def load_profile(spec: str) -> DeviceProfile:
    """Read, resolve and check the profile ``spec`` names (:func:`profile_path`).

    Raises
    ------
    ProfileError
        One line: no such profile, unreadable TOML, a missing or bad value, a
        derived profile whose base is missing or itself derived.
    """
    path = profile_path(spec)
    raw = _read(path)
    if "base" in raw:
        raw = _derive(raw, _read(profile_path(str(raw["base"]))), path)
    return _build(raw, path)


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ProfileError(f"device profile {path}: cannot be read "
                           f"({str(err).splitlines()[0]})") from None


def _derive(raw: dict, base: dict, path: Path) -> dict:
    """A derived profile: the base's costs x ``[scale]``, its own link and stragglers."""
    if "base" in base:
        raise ProfileError(f"device profile {path}: its base {raw['base']!r} is itself "
                           "derived; derive from a measured profile")
    scale = raw.get("scale", {})
    compute, server = (_number(path, f"scale.{k}", scale.get(k, 1.0), 0.0, False)
                       for k in ("compute", "server"))
    out = {k: v for k, v in raw.items() if k not in ("base", "scale")}
    out["tasks"] = {t: {k: float(c[k]) * compute for k in TASK_KEYS if k in c}
                    for t, c in base.get("tasks", {}).items()}
    out["fallback"] = {k: float(v) * compute
                       for k, v in base.get("fallback", {}).items()}
    out["server"] = {k: float(v) * server for k, v in base.get("server", {}).items()}
    out["link"] = {**base.get("link", {}), **raw.get("link", {})}
    out["derived_from"] = {"base": raw["base"], "compute_scale": compute,
                           "server_scale": server,
                           "base_calibration": base.get("calibration", {})}
    return out


def _build(raw: dict, path: Path) -> DeviceProfile:
    where = f"device profile {path}"
    tasks = {}
    for name, costs in _table(raw, "tasks", where).items():
        tasks[name] = TaskCost(*(_number(path, f"tasks.{name}.{k}", _get(costs, k, where),
                                         0.0, k == TASK_KEYS[0]) for k in TASK_KEYS))
    fallback = {k: _number(path, f"fallback.{k}", _get(_table(raw, "fallback", where), k,
                                                       where), 0.0, True)
                for k in FALLBACK_KEYS}
    server = {k: _number(path, f"server.{k}", _get(_table(raw, "server", where), k, where),
                         0.0, False) for k in SERVER_KEYS}
    link = raw.get("link", {})
    rate = link.get("rate_mbps")
    strag = raw.get("stragglers", {})
    stragglers = Stragglers(_unit(path, strag.get("fraction", 0.0)),
                            _number(path, "stragglers.slowdown",
                                    strag.get("slowdown", 1.0), 1.0, False),
                            _seed(path, strag.get("seed", 0)))
    resolved = {k: v for k, v in raw.items() if k != "calibration"}
    digest = hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str)
                            .encode()).hexdigest()
    return DeviceProfile(
        name=str(raw.get("name") or path.stem), description=str(raw.get("description", "")),
        measured=bool(raw.get("measured", False)), tasks=tasks, fallback=fallback,
        base_delay_s=_number(path, "link.base_delay_s", link.get("base_delay_s", 0.1),
                             0.0, False),
        link_rate_mbps=None if rate is None else _number(path, "link.rate_mbps", rate,
                                                         0.0, True),
        server=server, stragglers=stragglers,
        calibration=dict(raw.get("calibration", {})), digest=digest, source=str(path))


def _table(raw: dict, key: str, where: str) -> dict:
    value = raw.get(key)
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: has no [{key}] table")
    return value


def _get(table: Mapping, key: str, where: str) -> object:
    if key not in table:
        raise ProfileError(f"{where}: '{key}' is missing")
    return table[key]


def _number(path: Path, key: str, value: object, least: float, strict: bool) -> float:
    """``value`` as a finite float >= ``least`` (> it when ``strict``)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and (value > least if strict else value >= least)
    if not ok:
        relation = ">" if strict else ">="
        raise ProfileError(f"device profile {path}: {key} = {value!r} is not allowed: "
                           f"a finite number {relation} {least:g}")
    return float(value)


def _unit(path: Path, value: object) -> float:
    fraction = _number(path, "stragglers.fraction", value, 0.0, False)
    if fraction > 1:
        raise ProfileError(f"device profile {path}: stragglers.fraction = {value!r} is "
                           "not allowed: a number in [0, 1]")
    return fraction


def _seed(path: Path, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProfileError(f"device profile {path}: stragglers.seed = {value!r} is not "
                           "allowed: an integer >= 0")
    return value

"""``forget-run``: a later request's settings, read by the ServerApp from the run itself.

``flwr run . <federation> --run-config "forget-run='dep1'"`` asks the ServerApp to
carry out the pending requests of the finished run ``dep1`` (in ``results-dir``, or
``$SE_RESULTS_DIR`` on the SuperLink host) on the federation it is submitted to. The
operator types the run's name, nothing else: the ServerApp takes the settings the
run recorded in its catalog (``run.sqlite``) and adds ``later-requests = true``
(:mod:`server_app.stages.later`). A key typed with it that differs from both the
app's default and the run's stored value is refused in one line naming the keys,
so a retyped setting can never silently change what a later request does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from history.catalog import StoreError
from runstore.inbox import InboxError, RequestInbox
from server_app.config import ConfigError
from server_app.config.output import OutputConfig
from server_app.config.values import RUN_NAME

FORGET_RUN = "forget-run"
PER_PROCESS = frozenset({FORGET_RUN, "later-requests", "results-dir"})
"""Keys that say what one process does or where the run is, not what the run is."""


def stored_run_config(run_config: Mapping, defaults: Mapping) -> dict:
    """``run_config`` itself, or with ``forget-run`` set, the named run's own settings.

    Parameters
    ----------
    run_config : Mapping
        The run config Flower hands the ServerApp (``pyproject.toml``'s defaults
        with the operator's overrides fused in).
    defaults : Mapping
        ``pyproject.toml``'s ``[tool.flwr.app.config]`` (what was not typed).

    Returns
    -------
    dict
        The run config the ServerApp goes on with: for ``forget-run``, the stored
        settings with ``later-requests = true``.

    Raises
    ------
    ConfigError
        ``forget-run`` is no run name, names no finished run's catalog under the
        results folder, or a key typed with it differs from the stored value (one
        line naming the keys and the command that prints the stored ones).
    """
    name = str(run_config.get(FORGET_RUN) or "")
    if not name:
        return dict(run_config)
    if not RUN_NAME.fullmatch(name):
        raise ConfigError(f"run-config {FORGET_RUN!r} = {name!r} is not allowed: the "
                          "run-name of a finished run (A-Z a-z 0-9 . _ -)")
    results = OutputConfig(str(run_config.get("results-dir") or "")).resolved_results_dir()
    settings = _settings(results / name, name)
    typed = sorted(k for k, v in run_config.items() if k not in PER_PROCESS
                   and v != defaults.get(k) and v != settings.get(k))
    if typed:
        raise ConfigError(
            f"run-config {', '.join(typed)} given with {FORGET_RUN} = {name!r}: a later "
            "request runs with the settings the run recorded, and these differ from "
            f"them; leave them out (the stored ones: `show --run {name}`)")
    return {**settings, "results-dir": str(results), "later-requests": True}


def _settings(folder: Path, name: str) -> dict:
    """The settings the run in ``folder`` recorded (read only).

    Raises
    ------
    ConfigError
        No catalog there, or one that records no settings or does not read.
    """
    catalog = folder / "run.sqlite"
    if not catalog.is_file():
        raise ConfigError(f"run-config {FORGET_RUN!r} = {name!r}: no run there "
                          f"({catalog} is missing); give the results-dir that holds it")
    try:
        inbox = RequestInbox(catalog, read_only=True)
    except (InboxError, StoreError) as err:
        raise ConfigError(f"run-config {FORGET_RUN!r} = {name!r}: {err}") from None
    try:
        settings = inbox.settings()
    finally:
        inbox.close()
    if not settings:
        raise ConfigError(f"run-config {FORGET_RUN!r} = {name!r}: {catalog} records no "
                          "settings (a run that never started)")
    return settings

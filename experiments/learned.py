"""One learning, many requests: a run that starts from a copy of a finished learning.

An experiment that forgets several clients one at a time (issue 52: accuracy over
5 forgotten clients drawn before the runs) needs each forgotten client's run to
start from the same learned shards. Learning depends only on the run's settings
other than its requests, and every step of it is seeded, so learning once and
copying the finished learning into each client's run folder gives each run the
models and history a run of its own would learn: the catalog then says learning
is done (:func:`server_app.stages.learn.learn_federation` takes it back) and the
run goes on with its requests. ``tests/test_learned.py`` checks that a copied run's
summary equals a fresh run's in everything but the measured seconds.

The copy is refused when the learning was made with other settings than the run's
(any key outside :data:`REQUEST_KEYS`), or when its folder holds more than one
finished learning (a request done, a second stage).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Mapping
from contextlib import closing
from pathlib import Path

from cli import config as cli_config

REQUEST_KEYS = frozenset({
    "run-name", "frameworks", "num-requests", "clients-per-request",
    "request-distribution", "request-mode", "forget-clients", "forget-records",
    "forget-labels"})
"""Run-config keys that say what a run forgets and with what, not how it learns."""


class LearnedCopyError(ValueError):
    """The learning cannot stand for the run's: one line naming what differs."""


def learning_config(run_config: Mapping[str, object]) -> dict[str, object]:
    """``run_config`` as a learning-only run: no framework, no request.

    ``run-name`` is left to the caller (the learning's own folder).
    """
    return {**run_config, "frameworks": "none", "forget-clients": "",
            "forget-records": "", "forget-labels": ""}


def copy_learned(learned: Path, run_config: Mapping[str, object]) -> Path:
    """Make the run folder of ``run_config`` a copy of the finished learning ``learned``.

    Parameters
    ----------
    learned : Path
        The run folder of a finished learning-only run (``frameworks = "none"``;
        :func:`learning_config`), made with ``run_config``'s settings but for
        :data:`REQUEST_KEYS`.
    run_config : Mapping
        Kebab-case run-config keys over ``pyproject.toml``'s defaults; names
        ``results-dir`` and ``run-name`` (the folder made).

    Returns
    -------
    Path
        The new run folder; :func:`experiments.grid.run_in_process` with
        ``run_config`` then carries out its requests from the copied learning.

    Raises
    ------
    LearnedCopyError
        ``learned`` is not one finished learning (stages other than ``learn:``,
        requests), its settings differ from the run's outside
        :data:`REQUEST_KEYS` (the keys named), or the run's folder exists.
    """
    from server_app.config import RunConfig
    from server_app.stored import run_settings

    config = cli_config.merge(cli_config.defaults(), [run_config]).config
    target = Path(str(config["results-dir"])) / str(config["run-name"])
    if target.exists():
        raise LearnedCopyError(f"{target} exists: a copy of a learning is made once, "
                               "into a new run folder")
    stored = _finished_learning(learned / "run.sqlite")
    settings = run_settings(RunConfig.from_run_config(config), stored["data-dir"])
    differ = sorted(k for k in set(stored) | set(settings)
                    if k not in REQUEST_KEYS and stored.get(k) != settings.get(k))
    if differ:
        raise LearnedCopyError(f"{learned} learned with other settings than the run's "
                               f"({', '.join(differ)}): only {sorted(REQUEST_KEYS)} "
                               "may differ")
    shutil.copytree(learned, target, ignore=shutil.ignore_patterns("summary.json",
                                                                   "run.lock"))
    with closing(sqlite3.connect(target / "run.sqlite")) as catalog, catalog:
        catalog.execute("UPDATE settings SET value = ? WHERE key = 'settings'",
                        (json.dumps(settings, sort_keys=True),))
    return target


def _finished_learning(path: Path) -> dict:
    """The settings of the catalog ``path`` of one finished learning, else refuse."""
    if not path.is_file():
        raise LearnedCopyError(f"{path} does not exist: learn first")
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as catalog:
        stages = catalog.execute("SELECT name, state FROM stages").fetchall()
        requests = catalog.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        stored = catalog.execute(
            "SELECT value FROM settings WHERE key = 'settings'").fetchone()
    if (not stages or requests or stored is None
            or any(not n.startswith("learn:") or s != "done" for n, s in stages)):
        raise LearnedCopyError(f"{path.parent} is not one finished learning (stages "
                               f"{stages}, {requests} request(s))")
    return json.loads(stored[0])

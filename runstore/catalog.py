"""The run's own catalog (``run.sqlite``): what is done, so a killed run resumes.

It records the settings of the run, which stages finished (with their results as
JSON), every unlearning request with its state (``received`` -> ``in_progress``
-> ``done``) and every framework's state. Re-running the same command (same
``run-name``) after the ServerApp was killed skips what is done and redoes what
was in progress from the stored history; since every step is seeded, the models
are those of an uninterrupted run, and no request is lost or applied twice.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from history.catalog import SQLiteCatalog

_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS stages (
    name TEXT PRIMARY KEY, state TEXT NOT NULL, result TEXT);
CREATE TABLE IF NOT EXISTS requests (
    idx INTEGER PRIMARY KEY, clients TEXT NOT NULL, state TEXT NOT NULL);
"""

REQUEST_STATES = ("received", "in_progress", "done")
T = TypeVar("T")


CLIENT_RECORDS = "client-records"
"""Catalog fact of a ``client-data = true`` run: partition id -> records its node
reported at discovery (``client-samples`` applied), JSON; the latest process's."""


class RunLogError(RuntimeError):
    """The run folder belongs to a run with other settings, or its record is damaged."""


class SettingsMismatchError(RunLogError):
    """The run folder belongs to a run with other settings (the keys that differ named)."""


def settings_diff(old: dict, new: dict) -> list[str]:
    """The keys whose values differ between stored settings ``old`` and ``new``.

    A key the run did not record (one added to the app since) counts as equal
    when ``new`` has it at ``pyproject.toml``'s default: it changes nothing the
    run did, so a run made by an earlier version still takes later requests.
    """
    from task.config import default_run_config

    defaults = default_run_config()
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)
                  and not (k not in old and k in defaults and new.get(k) == defaults[k]))


class RunLog(SQLiteCatalog):
    """Progress catalog of one run folder.

    Parameters
    ----------
    path : Path
        ``<run folder>/run.sqlite``; created if missing.
    settings : dict
        The run's settings; a resumed run must have equal settings.
    read_only : bool
        Only read an existing catalog (every page checked, nothing created or
        written; :meth:`SQLiteCatalog.connect`): what the checks before a
        resume use (:mod:`server_app.stored`).

    Raises
    ------
    RunLogError
        The catalog holds a run with different settings.
    history.StoreError
        The file cannot be read as SQLite (one line, naming it).
    """

    SCHEMA = _SCHEMA
    META_TABLE = "settings"
    KIND = "run catalog"

    def __init__(self, path: Path, settings: dict, read_only: bool = False) -> None:
        self.path = Path(path)
        super().__init__(self.path, self.connect(self.path, read_only=read_only))
        try:
            if not read_only:  # CREATE TABLE IF NOT EXISTS: keeps a resumed run
                self.create_schema(self._conn)
            stored = self._stored_settings()
        except (sqlite3.Error, ValueError) as err:
            self.close()
            raise RunLogError(f"{self.KIND} {self.path} is damaged ({err}); restore or "
                              "remove it") from None
        text = json.dumps(settings, sort_keys=True)
        if stored is None and not read_only:
            with self._conn:
                self.set_meta("settings", text)
        elif stored is not None and stored != text and (
                diff := settings_diff(json.loads(stored), settings)):
            self.close()
            raise SettingsMismatchError(
                f"{self.path.parent} holds a run with other settings ({diff}; the "
                f"stored ones: `show --run {self.path.parent.name}`): to carry out its "
                f"requests give forget-run='{self.path.parent.name}' alone; to start a "
                "new run, use another run-name")
        self.resumed = stored is not None

    def _stored_settings(self) -> str | None:
        """The recorded settings (JSON text), checked to parse; None if none yet."""
        stored = self.get_meta("settings")
        if stored is not None and not isinstance(json.loads(stored), dict):
            raise ValueError("its settings are not a JSON object")
        return stored

    def record_once(self, key: str, value: str) -> str:
        """Store the fact ``key`` unless the catalog has it; return the stored value."""
        with self._conn:
            stored = self.get_meta(key)
            if stored is None:
                self.set_meta(key, value)
        return value if stored is None else stored

    def record(self, key: str, value: str) -> None:
        """Store the fact ``key`` (replacing an earlier value: the latest process's)."""
        with self._conn:
            self.set_meta(key, value)

    def has_table(self, name: str) -> bool:
        """Whether the catalog has the table ``name`` (e.g. a staged run's ``inbox``)."""
        return self._conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' "
                                  "AND name=?", (name,)).fetchone() is not None

    # ---- stages (learning, frameworks) -------------------------------------
    def stages(self) -> list[tuple[str, str]]:
        """(name, state) of every stage recorded, by name."""
        return [tuple(row) for row in self._conn.execute(
            "SELECT name, state FROM stages ORDER BY name")]

    def stage(self, name: str) -> tuple[str, object] | None:
        """(state, result) of a stage, or None if never started."""
        row = self._conn.execute("SELECT state, result FROM stages WHERE name=?",
                                 (name,)).fetchone()
        if row is None:
            return None
        return row[0], (json.loads(row[1]) if row[1] is not None else None)

    def done(self, name: str) -> object | None:
        """The stored result of a finished stage, or None if it is not done."""
        entry = self.stage(name)
        return entry[1] if entry and entry[0] == "done" else None

    def done_as(self, name: str, cls: type[T]) -> T | None:
        """The finished stage's result parsed as ``cls`` (``from_json``), or None.

        Raises
        ------
        RunLogError
            The stored result is not what ``cls.to_json`` writes (damaged or
            edited): it must parse and give back the same JSON.
        """
        done = self.done(name)
        if done is None:
            return None
        try:
            parsed = cls.from_json(done)  # type: ignore[attr-defined]
            same = json.dumps(parsed.to_json(), sort_keys=True) == json.dumps(
                done, sort_keys=True)
        except Exception as err:  # noqa: BLE001 - any parse failure is damage
            same, parsed = False, f"{type(err).__name__}: {err}"
        if not same:
            raise RunLogError(f"{self.path}: the stored result of stage {name!r} is "
                              f"damaged ({str(parsed)[:200]}); remove the run folder "
                              "to start again")
        return parsed

    def record_models(self, name: str, digest: str, shards: int) -> None:
        """Remember the SHA-256 and shard count of ``models/<name>.npz``."""
        with self._conn:
            self.set_meta(f"models:{name}", json.dumps({"sha256": digest,
                                                         "shards": shards}))

    def models_record(self, name: str) -> dict | None:
        """``{"sha256", "shards"}`` recorded for ``name``'s models file, or None."""
        text = self.get_meta(f"models:{name}")
        return None if text is None else json.loads(text)

    def begin(self, name: str) -> None:
        """Mark a stage in progress."""
        with self._conn:
            self._conn.execute("INSERT OR REPLACE INTO stages VALUES (?, ?, NULL)",
                               (name, "in_progress"))

    def progress(self, name: str, result: object) -> None:
        """Keep a stage in progress with what it has done so far (JSON-serialisable).

        A killed run reads it back with :meth:`in_progress` (a learning stage's
        last finished round: :mod:`server_app.stages.learn`).
        """
        with self._conn:
            self._conn.execute("INSERT OR REPLACE INTO stages VALUES (?, ?, ?)",
                               (name, "in_progress", json.dumps(result)))

    def in_progress(self, name: str) -> object | None:
        """What :meth:`progress` last kept of a stage still in progress, or None."""
        entry = self.stage(name)
        return entry[1] if entry and entry[0] == "in_progress" else None

    def finish(self, name: str, result: object) -> None:
        """Mark a stage done with its JSON-serialisable result."""
        with self._conn:
            self._conn.execute("INSERT OR REPLACE INTO stages VALUES (?, ?, ?)",
                               (name, "done", json.dumps(result)))

    # ---- requests ----------------------------------------------------------
    def record_requests(self, requests: Sequence[Sequence[int]]) -> list[list[int]]:
        """Store the requests once (state ``received``); return the stored ones.

        On a resumed run the stored requests must be the planned ones (the
        plan is seeded), so none is lost, changed or added.

        Raises
        ------
        RunLogError
            The stored requests differ from the planned ones.
        """
        planned = self.check_requests(requests)
        if self.requests():
            return planned
        with self._conn:
            self._conn.executemany(
                "INSERT INTO requests VALUES (?, ?, 'received')",
                [(i, json.dumps(r)) for i, r in enumerate(planned)])
        return planned

    def check_requests(self, requests: Sequence[Sequence[int]]) -> list[list[int]]:
        """``requests`` sorted, if the recorded ones (if any) are these.

        Raises
        ------
        RunLogError
            Requests are recorded and differ from ``requests``.
        """
        planned = [sorted(int(p) for p in r) for r in requests]
        stored = [clients for _, clients, _ in self.requests()]
        if stored and stored != planned:
            raise RunLogError(f"{self.path}: the recorded requests {stored} are "
                              f"not the planned {planned}; the run catalog is "
                              "damaged, remove the run folder to start again")
        return planned

    def set_request_state(self, state: str) -> None:
        """Move every request that is not done to ``state``."""
        if state not in REQUEST_STATES:
            raise ValueError(f"request state {state!r}: one of {REQUEST_STATES}")
        with self._conn:
            self._conn.execute("UPDATE requests SET state=? WHERE state != 'done'",
                               (state,))

    def requests(self) -> list[tuple[int, list[int], str]]:
        """(index, clients, state) of every request, in order."""
        return [(i, json.loads(c), s) for i, c, s in self._conn.execute(
            "SELECT idx, clients, state FROM requests ORDER BY idx")]

"""A run folder's stored state, checked before any engine starts.

A run started again with the same ``run-name`` resumes from what an earlier start
stored (:mod:`runstore.catalog`). :func:`check_run_folder` reads all of it
back, changing nothing, and fails with one line on the first thing that a resume
could not use:

- the folder may be used (:meth:`RunFolder.check_free`: ``results-dir``, a
  finished run, a folder of something else, a live run's lock);
- the run catalog ``run.sqlite`` reads as SQLite, every page
  (``PRAGMA quick_check``), and records the settings of this run;
- the recorded requests are the planned ones (a one-stage run);
- every finished stage's result parses as its typed form (``learn:``,
  ``unlearn:``, ``stage:``), and the models file it recorded has the recorded
  SHA-256 (``models/<F>.npz``, ``models/stage<t>.npz``);
- the history store of every finished learning (uncoded), or of a staged run
  with a finished stage, opens, and (``verify_blobs``) every blob matches its
  SHA-256;
- the inbox's requests, receipts and model versions parse, and every model
  version's file has its recorded SHA-256.

The command line runs it before it starts any engine (``run``, ``deploy``), the
ServerApp again before it opens the folder (:func:`server_app.app.prepare`).

A later request on a finished run (``forget``) reads the run's coded history
back from its clients' node folders; :func:`check_node_folders` checks, before
``forget`` starts the engine and again in the ServerApp, that every node folder
the run's simulated clients wrote (run-config ``node-dirs``) is still there.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from history import HistoryStore, StoreError
from history.catalog import CATALOG_FILE, SQLiteCatalog
from runstore.catalog import RunLog, RunLogError
from runstore.folder import ModelsFileError, RunFolder
from runstore.inbox import InboxError, RequestInbox
from runstore.summary import FrameworkSummary, LearningSummary, StageSummary
from runstore.versions import verify_version
from server_app.config import ConfigError, RunConfig

RESULTS = {"learn": LearningSummary, "unlearn": FrameworkSummary, "stage": StageSummary}
"""Typed form of a finished stage's result, by the stage name's prefix."""


class StoredStateError(ConfigError):
    """The run folder holds something a resume cannot use; nothing was changed."""


def run_settings(cfg: RunConfig, data_dir: str | Path) -> dict:
    """The settings a run records in its catalog; a resume must record the same.

    Paths are resolved (``results-dir``: the folder holding the run folder;
    ``data-dir``: the dataset's folder), so another spelling of the same
    folders is the same run. ``later-requests`` and ``forget-run`` are left out:
    they say what one process does (carry out a finished run's requests), not
    what the run is.
    """
    settings = {**cfg.as_dict(), "results-dir": str(cfg.output.resolved_results_dir()),
                "data-dir": str(data_dir)}
    for key in ("later-requests", "forget-run"):  # what one process does
        settings.pop(key, None)
    return settings


def check_run_folder(cfg: RunConfig, settings: dict,
                     requests: list[list[int]] | None = None,
                     verify_blobs: bool = True) -> Path:
    """Check what the run folder of ``cfg`` holds; return its path (maybe absent).

    Parameters
    ----------
    cfg : RunConfig
        The run's settings (they name the folder).
    settings : dict
        :func:`run_settings` of the run.
    requests : list[list[int]], optional
        A one-stage run's planned requests (partition ids); None: not checked.
    verify_blobs : bool
        Also hash every blob of the history stores (bytes read: the stores'
        size).

    Raises
    ------
    ConfigError
        One line: the folder may not be used, or the first stored thing that
        cannot be read back (:class:`StoredStateError`).
    """
    path = RunFolder.check_free(cfg.output.resolved_results_dir(), cfg.resolved_run_name())
    catalog = path / "run.sqlite"
    if not catalog.exists():
        return path
    if not catalog.is_file():
        raise StoredStateError(f"run catalog {catalog} is not a file; remove it")
    _read_back(path, cfg, settings, requests, verify_blobs)
    return path


def _read_back(path: Path, cfg: RunConfig, settings: dict,
               requests: list[list[int]] | None, verify_blobs: bool) -> None:
    """Catalog, planned requests, stage results, models, histories and inbox of ``path``.

    Raises
    ------
    StoredStateError
        The first thing that cannot be read back (one line).
    """
    try:
        log = RunLog(path / "run.sqlite", settings, read_only=True)
    except (StoreError, RunLogError) as err:
        raise StoredStateError(str(err)) from None
    try:
        if requests is not None:
            log.check_requests(requests)
        done = _finished(log)
        _check_models(RunFolder(path), log, done)
        _check_histories(RunFolder(path), cfg, done, verify_blobs)
        _check_inbox(log)
    except (StoreError, RunLogError, ModelsFileError) as err:
        raise StoredStateError(str(err)) from None
    finally:
        log.close()


def check_finished_run(cfg: RunConfig, settings: dict, folder: Path) -> None:
    """What a later request reads back from a finished run, read back first.

    As :func:`check_run_folder` for a resume, less the refusal of a finished
    run: the catalog with ``settings`` (as the run recorded them), every
    finished stage's result, the models files it recorded, the uncoded history
    (every blob against its SHA-256), the inbox and every model version's file.
    Nothing is changed.

    ``summary.json`` is read back first: a later request leaves it as it is, so
    a damaged one would stay damaged beside the new versions.

    Raises
    ------
    StoredStateError
        The first thing a later request could not use (one line, naming it).
    """
    check_summary(folder / "summary.json")
    _read_back(folder, cfg, settings, None, verify_blobs=True)


def check_summary(path: Path) -> None:
    """``summary.json`` of a finished run parses as a run summary.

    Only its form is checked (no digest of it is recorded): a truncated or
    malformed file is found, a well-formed edit is not.

    Raises
    ------
    StoredStateError
        It cannot be read, is not JSON (truncated, edited), or is not a run
        summary (one line, naming the file).
    """
    from runstore.summary import RunSummary

    try:
        RunSummary.from_json(json.loads(path.read_text()))
    except OSError as err:
        raise StoredStateError(f"{path}: cannot be read ({err.strerror}); restore "
                               "it") from None
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise StoredStateError(f"{path} does not read back as a run summary ({first}); "
                               "restore it from a backup before a later request"
                               ) from None


def _finished(log: RunLog) -> dict[str, object]:
    """Each finished stage's result, parsed (stages of unknown kinds: as stored).

    Raises
    ------
    RunLogError
        A stored result is damaged.
    """
    return {name: log.done_as(name, RESULTS[name.split(":")[0]])
            if name.split(":")[0] in RESULTS else log.done(name)
            for name, state in log.stages() if state == "done"}


def _check_models(folder: RunFolder, log: RunLog, done: dict[str, object]) -> None:
    """The models files of finished frameworks and stages are the ones recorded."""
    for name, result in done.items():
        kind, _, what = name.partition(":")
        if kind == "unlearn" and not result.noop:
            folder.verify_models(what, log.models_record(what))
        elif kind == "stage":
            folder.verify_models(f"stage{what}", log.models_record(f"stage{what}"))


def _check_histories(folder: RunFolder, cfg: RunConfig, done: dict[str, object],
                     verify_blobs: bool) -> None:
    """History stores a resume reads: of finished (uncoded) learning, of a staged run.

    Coded learning is redone on resume (its slices lived with the clients of
    the lost run), so its store is not read back.

    Raises
    ------
    StoreError
        A store is missing, cannot be read, is incomplete, or (``verify_blobs``)
        holds a blob that is missing or fails its SHA-256.
    """
    wanted = {name.partition(":")[2]: True for name in done if name.startswith("learn:")}
    if cfg.storage.coded:
        wanted.pop("sharded", None)
    if any(name.startswith("stage:") for name in done):
        wanted["sharded"] = False  # written stage by stage: not complete until the end
    for federation, complete in sorted(wanted.items()):
        root = folder.history_dir(federation)
        try:
            store = HistoryStore.open(root, require_complete=complete)
        except StoreError as err:
            raise StoreError(f"{err}; the run catalog records its learning as done: "
                             "restore it or remove the run folder to start again"
                             ) from None
        try:
            problems = store.verify() if verify_blobs else []
        finally:
            store.close()
        if problems:
            raise StoreError(f"history {root} is damaged ({'; '.join(problems[:3])}"
                             f"{'; ...' if len(problems) > 3 else ''}); restore it or "
                             "remove the run folder to start again")


def _check_inbox(log: RunLog) -> None:
    """The inbox's requests, receipts and model versions can be read back.

    Every model version's file (``models/<name>.npz``) has its recorded SHA-256.

    Raises
    ------
    RunLogError
        A row that does not parse; a run that took requests after it finished
        and has lost its summary.json.
    ModelsFileError
        A model version's file is missing or not the one recorded, or its
        arrays do not have the recorded models digest.
    """
    if not log.has_table("inbox"):
        return
    try:
        inbox = RequestInbox(log.path, read_only=True)
    except (StoreError, InboxError) as err:
        raise RunLogError(str(err)) from None
    try:
        versions = inbox.check()
        later = [r for r in inbox.receipts() if r.get("after_run")]
    except InboxError as err:
        raise RunLogError(f"{err}; restore or remove it") from None
    finally:
        inbox.close()
    summary = log.path.parent / "summary.json"
    if later and not summary.exists():  # it finished: its history is the later one
        raise RunLogError(
            f"{summary} is missing, but the run finished: {len(later)} request(s) "
            f"were carried out after it (latest model version v{versions[-1].version}"
            "); restore the file (a finished run is not learned again)")
    for version in versions:  # models/<name>.npz of each, and its arrays' digest
        verify_version(log.path.parent, version)


def missing_node_folders(cfg: RunConfig, folder: Path) -> dict[int, Path]:
    """Node folders a finished coded run's simulated clients wrote that are gone.

    A simulated client p of a run with ``node-dirs`` keeps its slices in
    ``<node-dirs>/<p>``; the clients that wrote there are those whose
    acknowledged slices took disk bytes (the coded catalog's ``slices`` table).

    Parameters
    ----------
    cfg : RunConfig
        The finished run's settings (as its catalog recorded them).
    folder : Path
        The run folder.

    Returns
    -------
    dict[int, Path]
        Partition id -> its node folder, for each one that is missing or is not
        a folder; empty for uncoded runs and runs without ``node-dirs``.

    Raises
    ------
    StoredStateError
        The run's coded history catalog is missing or cannot be read (one line,
        naming it).
    """
    if not (cfg.storage.coded and cfg.storage.node_dirs):
        return {}
    catalog = RunFolder(folder).history_dir("sharded") / CATALOG_FILE
    if not catalog.is_file():
        raise StoredStateError(f"no coded history store at {catalog.parent}: the "
                               "run's later requests decode it; restore it")
    try:
        conn = SQLiteCatalog.connect(catalog, read_only=True)
    except StoreError as err:
        raise StoredStateError(str(err)) from None
    try:
        writers = [int(r[0]) for r in conn.execute(
            "SELECT DISTINCT partition_id FROM slices WHERE disk_bytes > 0 "
            "ORDER BY partition_id")]
    except sqlite3.Error as err:
        raise StoredStateError(f"coded store {catalog} is damaged ({err}); restore "
                               "it") from None
    finally:
        conn.close()
    root = Path(cfg.storage.node_dirs)
    return {p: root / str(p) for p in writers if not (root / str(p)).is_dir()}


def check_node_folders(cfg: RunConfig, folder: Path, lost: Iterable[int] = ()) -> None:
    """Every node folder the finished coded run wrote is there, or accepted as lost.

    A missing node folder is most likely a mistake (a moved or unmounted
    folder): carrying on would count all its slices as erasures, so it is
    refused unless the operator names it in ``lost`` (``forget --lost-nodes``).

    Parameters
    ----------
    cfg : RunConfig
        The finished run's settings (as its catalog recorded them).
    folder : Path
        The run folder.
    lost : Iterable[int]
        Partition ids whose node folders the operator accepts as lost.

    Raises
    ------
    StoredStateError
        One line naming each missing node folder not in ``lost`` and what to do,
        or the coded history catalog cannot be read. Nothing is changed on disk.
    """
    accepted = set(lost)
    left = {p: path for p, path in missing_node_folders(cfg, folder).items()
            if p not in accepted}
    if left:
        ids = ",".join(map(str, left))
        raise StoredStateError(
            f"node folder(s) {', '.join(map(str, left.values()))} of coded run "
            f"{folder.name!r} are missing or not folders (they hold client(s) "
            f"{ids}'s slices of its history): restore them; if they are gone for good, "
            f"`forget --run {folder.name} --lost-nodes {ids} ...` accepts them as lost "
            "(their slices count as erasures)")


def check_slice_budget(cfg: RunConfig, folder: Path, lost: Iterable[int]) -> None:
    """Each coded round keeps k slices once the ``lost`` clients' count as erasures.

    A round's usable slices are those its holders acknowledged, less the lost
    clients' and the stale ones (a re-coded round's part that could not reach a
    holder); decoding needs k = K + T of them (the coded catalog's meta).
    Damaged slice files inside a folder that is there are not counted here:
    they show when the request decodes (the request is then marked failed).

    Raises
    ------
    StoredStateError
        One line naming the first round and shard that could not be decoded,
        its usable slices and k. Nothing is changed on disk.
    """
    gone = set(lost)
    if not (cfg.storage.coded and gone):
        return
    catalog = RunFolder(folder).history_dir("sharded") / CATALOG_FILE
    try:
        conn = SQLiteCatalog.connect(catalog, read_only=True)
    except StoreError as err:
        raise StoredStateError(str(err)) from None
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta"))
        k = int(meta["blocks_per_shard"]) + int(meta.get("privacy_t", 0))
        # every coded round, also one no holder acknowledged (it has 0 usable)
        holders: dict[int, set[int]] = {
            int(rnd): set() for (rnd,) in conn.execute("SELECT round FROM rounds")}
        for rnd, pid in conn.execute("SELECT round, partition_id FROM slices"):
            holders.setdefault(int(rnd), set()).add(int(pid))
        stale = list(conn.execute("SELECT shard, round, partition_id FROM stale"))
        shards = int(meta["num_shards"])
    except (sqlite3.Error, KeyError, ValueError) as err:
        raise StoredStateError(f"coded store {catalog} is damaged ({err}); restore "
                               "it") from None
    finally:
        conn.close()
    for rnd, pids in sorted(holders.items()):
        for shard in range(shards):
            out = {p for s, g, p in stale if s == shard and g == rnd}
            usable = len(pids - gone - out)
            if usable < k:
                raise StoredStateError(
                    f"coded run {folder.name!r}: with client(s) {sorted(gone)}'s "
                    f"slices lost, round {rnd} of shard {shard} keeps {usable} usable "
                    f"slices, k = {k} needed: a later request could not decode it; "
                    "restore node folders (nothing was recorded)")

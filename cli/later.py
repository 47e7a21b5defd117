"""Carry out the pending requests of a finished run (``forget`` on a finished run).

The run's own settings, as its catalog recorded them, go back to the engine with
``later-requests = true`` (:mod:`server_app.stages.later`): Flower's simulation
engine with one SuperNode per client, as ``./simulate.sh`` ran it. The command
prints one line per request handled (:func:`runstore.receipts.receipt_line`)
and exits 0 when every pending request is done or refused, 1 when one is still
pending (the engine failed: see its log; run ``forget --pending`` again).

Before the engine starts, a coded run's node folders are checked
(:func:`check_later`): a missing one is refused in one line (restore it), or,
named in ``--lost-nodes``, accepted as lost (made again, empty: its slices count
as erasures).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cli.later_route import HERE, SIMULATION, Route, submit_to, unreachable
from cli.receipts import receipt_line
from cli.runs import open_inbox, parse_clients
from cli.terminal import TerminalFilter
from runstore.folder import COMMAND_LOGS
from runstore.lock import RunLock
from runstore.receipts import missing_files
from server_app.config import ConfigError, RunConfig
from server_app.failures import DISK as DISK_ERRNOS
from server_app.preflight import validate_run_config
from server_app.stored import (
    check_finished_run,
    check_node_folders,
    check_slice_budget,
    missing_node_folders,
)

FAILED = 3
"""Exit status: a request failed for a reason a retry cannot fix (marked ``failed``)."""
BUSY = 4
"""Exit status: the request is recorded, but another command works on the run."""
REFUSED = 2
"""Exit status: a request was refused (its receipt says why); never 0."""
DISK = 5
"""Exit status: the disk is full or read-only (:data:`server_app.failures.DISK`)."""

def check_later(folder: Path, lost: str | None = None) -> list[Path]:
    """What a later request on the finished run ``folder`` reads back is there.

    Every node folder the run's simulated clients wrote (a coded run with
    ``node-dirs``, :func:`server_app.stored.check_node_folders`). Nothing
    is changed on disk.

    Parameters
    ----------
    folder : Path
        The finished run's folder.
    lost : str, optional
        ``--lost-nodes``: partition ids (``"3,5"``) whose missing node folders
        the operator accepts as lost.

    Returns
    -------
    list[Path]
        The node folders accepted as lost, to be made again (empty) before the
        engine starts: their clients then hold no slices, which the server
        counts as erasures.

    Raises
    ------
    ConfigError
        The recorded settings fail :func:`later_config` (a plug-in that cannot
        be imported or built, a moved run folder, a missing data folder); the
        run's stored state fails :func:`server_app.stored.check_finished_run`
        (its summary.json, its model versions' files and digests, its history);
        a missing node folder not named in ``lost``; ``lost`` for a run that is not
        coded (it keeps no node folders), empty, or naming a
        client whose node folder is there, or a path that is not a folder (one
        line).
    """
    with open_inbox(folder) as inbox:
        settings = inbox.settings()
    check_finished_run(RunConfig.from_run_config(settings), settings, folder)
    cfg = later_config(folder, settings)  # then what the engine is given
    if lost is not None and not cfg.storage.coded:
        raise ConfigError(f"--lost-nodes {lost!r}: run {folder.name} has storage = "
                          f"{cfg.storage.mode!r}, which keeps no node folders (only "
                          "a coded run's clients hold slices)")
    missing = missing_node_folders(cfg, folder)
    ids = [] if lost is None else parse_clients(lost, cfg.data.num_clients,
                                                "--lost-nodes")
    there = [p for p in ids if p not in missing]
    if there:
        raise ConfigError(f"--lost-nodes {lost!r}: the node folder(s) of client(s) "
                          f"{there} are there (or were never written); name only "
                          f"missing ones: {sorted(missing) or 'none is missing'}")
    blocked = [str(missing[p]) for p in ids if os.path.lexists(missing[p])]
    if blocked:
        raise ConfigError(f"--lost-nodes {lost!r}: {', '.join(blocked)} is not a "
                          "folder; move it away first")
    check_node_folders(cfg, folder, ids)
    check_slice_budget(cfg, folder, ids)  # a decode that cannot succeed: not recorded
    return [missing[p] for p in ids]


def later_config(folder: Path, settings: dict) -> RunConfig:
    """The settings the engine gets for a later request, checked as it will use them.

    Every check the ServerApp makes without nodes
    (:func:`server_app.preflight.validate_run_config`: the run's plug-in task
    and methods imported, and built on its model when the data is there), and
    that the recorded ``results-dir`` and ``data-dir`` still hold the run and
    its data: the ServerApp opens the folders the catalog records, not the
    one the command was given.

    Raises
    ------
    ConfigError
        One line naming what the engine could not use; nothing is written.
    """
    cfg = validate_run_config({**settings, "later-requests": True}, files=False)
    named = str(settings.get("run-name", ""))
    if named != folder.name:  # a copy or a renamed folder: the engine opens `named`
        raise ConfigError(f"--run {folder.name!r}: its catalog records run-name "
                          f"{named!r} (a copied or renamed run folder?): a later "
                          f"request on it would change run {named!r}; a run folder "
                          "cannot be renamed or copied")
    recorded = Path(str(settings.get("results-dir", ""))).resolve()
    if recorded != folder.parent.resolve():
        raise ConfigError(f"--run {folder.name!r}: its catalog records results-dir "
                          f"{str(recorded)!r}, but the run folder is {str(folder)!r} "
                          "(moved?): move it back there; a run folder cannot move")
    data = str(settings.get("data-dir", "") or "")
    if data and not Path(data).is_dir():
        raise ConfigError(f"--run {folder.name!r}: its data-dir {data!r} is gone: "
                          "restore the dataset there first")
    return cfg


def carry_out(folder: Path, prog: str, made: Sequence[Path] = (),
              where: Route = HERE) -> int:
    """Start the engine on ``folder``'s pending requests; return the exit status.

    The caller has run :func:`check_later` on the folder (the stored state
    read back, the node folders checked).

    Parameters
    ----------
    folder : Path
        The finished run's folder.
    prog : str
        The command's name, for messages.
    made : Sequence[Path]
        Node folders accepted as lost (:func:`check_later`'s result): made
        again, empty, once the run is claimed.
    where : Route
        Flower's simulation engine here, or the run's federation
        (:func:`cli.later_route.route`, checked before the request was recorded).

    Returns 0, 1 or :data:`FAILED` (:func:`_report`), or :data:`BUSY`: another
    command works on the run (its lock is held, or its processes live); the
    pending requests stay recorded for it or a later ``--pending``.

    Raises
    ------
    ConfigError
        The recorded settings no longer pass the checks (one line; nothing
        was started).
    """
    with open_inbox(folder) as inbox:
        settings, pending = inbox.settings(), [r.id for r in inbox.pending()]
        known = {r.id for r in inbox.all()}
    if not pending:
        print(f"run {folder.name}: no pending request")
        return 0
    overrides = {**settings, "later-requests": True}
    cfg = later_config(folder, settings)
    from cli.simulation import claim_run, launch

    holder = RunLock.holder(folder)
    try:
        if holder is not None:
            raise ConfigError(holder)
        claim_run(folder)
    except ConfigError:  # another command works on the run: it may take them
        print(f"{prog}: run {folder.name} is busy (another command works on it"
              f"{f': {holder}' if holder else ''}): {', '.join(pending)} recorded, "
              "not carried out by this command; the command at work takes requests "
              f"recorded while it works, else `{prog} --run {folder.name} --pending` "
              "once it is free (`receipts` shows which)", file=sys.stderr)
        return BUSY
    for path in made:  # the operator's choice: no slices there, each one an erasure
        path.mkdir(parents=True)
        print(f"{prog}: node folder {path} accepted as lost (made again, empty): its "
              "slices count as erasures", file=sys.stderr)

    not_run = _not_run_later(cfg)
    if not_run:
        print(f"{prog}: {not_run}", file=sys.stderr)
    terminal = TerminalFilter()
    if where.engine == SIMULATION:
        print(f"{prog}: carrying out {', '.join(pending)} on run {folder.name} (Flower's "
              f"simulation engine, {cfg.data.num_clients} SuperNodes)", file=sys.stderr)
        log_path, status = launch(overrides, cfg.data.num_clients, folder / COMMAND_LOGS,
                                  terminal, gpus=cfg.training.client_gpus)
    else:
        print(f"{prog}: carrying out {', '.join(pending)} on run {folder.name} "
              f"(federation {where.federation!r}: its SuperNodes train)", file=sys.stderr)
        log_path, status = submit_to(folder, where.federation, terminal)
        unreached = unreachable(log_path)
        if unreached is not None:
            print(f"{prog}: federation {where.federation!r} cannot be reached: "
                  f"{unreached}; {', '.join(pending)} "
                  f"{'stay' if len(pending) != 1 else 'stays'} pending (`{prog} --run "
                  f"{folder.name} --pending` once it is up; the log: {log_path})",
                  file=sys.stderr)
            return 1
    terminal.release(sys.stdout.buffer)
    if terminal.failure is not None:  # the ServerApp's one line, and its status
        code, line = terminal.failure
        _report(folder, pending, known, (log_path, status), quiet=True)
        with open_inbox(folder) as inbox:
            left = [r.id for r in inbox.pending() if r.id in pending]
        print(f"{prog}: {line} ({', '.join(left) or 'no request'} not carried out: "
              f"{'they stay' if len(left) != 1 else 'it stays'} pending; the log: "
              f"{log_path})", file=sys.stderr)
        return code
    return _report(folder, pending, known, (log_path, status))


def _not_run_later(cfg: RunConfig) -> str:
    """Which of the run's frameworks a later request leaves out, in one line ("": none).

    A later request is served by SE, with FR retraining as the reference when the
    run has it (:mod:`server_app.stages.later`); the run's other methods ran on its
    planned requests only. A run without SE filed no planned receipt: its model
    versions (SE's shards) still hold the clients its baselines forgot.
    """
    from server_app.config.methods import proposed, reference

    names = cfg.unlearning.framework_list
    serving = [proposed()] + [reference()] * (reference() in names)
    left = [n for n in names if n not in serving]
    out = []
    if left:
        ref = f" ({reference()} as the reference)" if len(serving) > 1 else ""
        out.append(f"a later request is carried out by {' and '.join(serving)}{ref}; "
                   f"{', '.join(left)} of the run's frameworks ran on its planned "
                   "requests only")
    if names and proposed() not in names:  # the baselines forgot on their own models
        out.append(f"the run's frameworks leave out {proposed()}, so its planned "
                   "requests changed none of its model versions: the clients they "
                   "named are still in its models and stores until a request names them")
    return "; ".join(out)


def _report(folder: Path, ids: list[str], known: set[str],
            engine: tuple[Path, int], quiet: bool = False) -> int:
    """Each request's fate: this command's, and those others recorded meanwhile.

    Returns 0 (all of this command's done or refused), 1 (one still pending: the
    engine failed; a retry may work) or :data:`FAILED` (one of this command's
    failed: a retry cannot fix it); another command's request only shown.
    ``quiet``: the receipts and failures only (the caller says the rest).
    """
    with open_inbox(folder) as inbox:
        requests = {r.id: r for r in inbox.all()}
        receipts = {r["request_id"]: r for r in inbox.receipts()}
    others = [rid for rid in requests if rid not in known and rid in receipts]
    for rid in [*ids, *others]:  # another command's request taken by this engine
        if rid in receipts:
            print(receipt_line(receipts[rid])
                  + ("  (recorded by another command)" if rid in others else ""))
    left = [rid for rid in ids if requests[rid].state == "pending"]
    failed = [rid for rid in [*ids, *others] if requests[rid].state == "failed"]
    for rid in failed:
        print(f"failed: {rid}: {receipts[rid]['reason']} (not retried: repair the "
              "run's store, then request its clients again)", file=sys.stderr)
    refused = [rid for rid in ids if requests[rid].state == "refused"]
    for rid in refused:  # recorded meanwhile by another command, or before the checks
        print(f"refused: {rid}: {receipts[rid]['reason']}", file=sys.stderr)
    unfiled = missing_files(folder, [receipts[r] for r in [*ids, *others] if r in receipts])
    for rid, err in unfiled.items():
        print(f"receipt of {rid} not written ({err}); it is kept in "
              f"{folder / 'run.sqlite'}, and `receipts --run {folder.name}` writes it "
              "once it can", file=sys.stderr)
    if quiet:
        return 0
    if left:
        print(f"not handled: {', '.join(left)} (the engine did not carry them out; "
              f"flwr exit status {engine[1]}; see {engine[0]}); they stay recorded",
              file=sys.stderr)
    if any(rid in ids for rid in failed):
        return FAILED
    if left:
        return 1
    if unfiled:  # done, but its receipt file is missing: the disk (5) or else (1)
        return DISK if any(e.errno in DISK_ERRNOS for e in unfiled.values()) else 1
    if refused:
        return REFUSED
    print(f"receipts: {folder / 'receipts'}", flush=True)
    return 0

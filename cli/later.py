"""Carry out the pending requests of a finished run (``forget`` on a finished run).

The run's own settings, as its catalog recorded them, go back to the engine with
``later-requests = true`` (:mod:`server_app.stages.later`): Flower's simulation
engine with one SuperNode per client, as ``./simulate.sh`` ran it. The command
prints one line per request handled (:func:`server_app.run.receipts.receipt_line`)
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

from cli.runs import open_inbox, parse_clients
from cli.terminal import TerminalFilter
from server_app.config import ConfigError, RunConfig
from server_app.preflight import validate_run_config
from server_app.run.folder import COMMAND_LOGS
from server_app.run.lock import RunLock
from server_app.run.receipts import receipt_line
from server_app.run.stored import (
    check_finished_run,
    check_node_folders,
    missing_node_folders,
)


def check_later(folder: Path, lost: str | None = None) -> list[Path]:
    """What a later request on the finished run ``folder`` reads back is there.

    Every node folder the run's simulated clients wrote (a coded run with
    ``node-dirs``, :func:`server_app.run.stored.check_node_folders`). Nothing
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
        The run's stored state fails :func:`server_app.run.stored.check_finished_run`;
        a missing node folder not named in ``lost``; ``lost`` is empty, names a
        client whose node folder is there, or a path that is not a folder (one
        line).
    """
    with open_inbox(folder) as inbox:
        settings = inbox.settings()
    cfg = RunConfig.from_run_config(settings)
    check_finished_run(cfg, settings, folder)  # what the request will read back
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
    return [missing[p] for p in ids]


def carry_out(folder: Path, prog: str, made: Sequence[Path] = ()) -> int:
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

    Raises
    ------
    ConfigError
        A live process holds the run's lock, or the recorded settings no
        longer pass the checks (one line; nothing was started).
    """
    with open_inbox(folder) as inbox:
        settings, pending = inbox.settings(), [r.id for r in inbox.pending()]
    if not pending:
        print(f"run {folder.name}: no pending request")
        return 0
    holder = RunLock.holder(folder)
    if holder is not None:
        raise ConfigError(f"--run {folder.name!r} is busy ({holder}): the requests "
                          f"{pending} are recorded; run `{prog} --run {folder.name} "
                          "--pending` once it is free")
    overrides = {**settings, "later-requests": True}
    cfg = validate_run_config(overrides, files=False)
    from cli.simulation import claim_run, launch

    try:
        claim_run(folder)
    except ConfigError:  # another command works on the run right now
        raise ConfigError(f"--run {folder.name!r} is busy (another command's processes "
                          f"work on it): the requests {pending} are recorded; the "
                          f"command at work may carry them out, else `{prog} --run "
                          f"{folder.name} --pending` once it is free") from None
    for path in made:  # the operator's choice: no slices there, each one an erasure
        path.mkdir(parents=True)
        print(f"{prog}: node folder {path} accepted as lost (made again, empty): its "
              "slices count as erasures", file=sys.stderr)

    print(f"{prog}: carrying out {', '.join(pending)} on run {folder.name} (Flower's "
          f"simulation engine, {cfg.data.num_clients} SuperNodes)", file=sys.stderr)
    terminal = TerminalFilter()
    log_path, status = launch(overrides, cfg.data.num_clients, folder / COMMAND_LOGS,
                              terminal, gpus=cfg.training.client_gpus)
    terminal.release(sys.stdout.buffer)
    return _report(folder, pending, log_path, status)


def _report(folder: Path, ids: list[str], log_path: Path, status: int) -> int:
    with open_inbox(folder) as inbox:
        requests = {r.id: r for r in inbox.all()}
        receipts = {r["request_id"]: r for r in inbox.receipts()}
    left = [rid for rid in ids if requests[rid].state == "pending"]
    for rid in ids:
        if rid in receipts:
            print(receipt_line(receipts[rid]))
    if left:
        print(f"not handled: {', '.join(left)} (the engine did not carry them out; "
              f"flwr exit status {status}; see {log_path}); they stay recorded",
              file=sys.stderr)
        return 1
    print(f"receipts: {folder / 'receipts'}", flush=True)
    return 0

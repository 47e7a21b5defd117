"""Carry out the pending requests of a finished run (``forget`` on a finished run).

The run's own settings, as its catalog recorded them, go back to the engine with
``later-requests = true`` (:mod:`server_app.stages.later`): Flower's simulation
engine with one SuperNode per client, as ``./simulate.sh`` ran it. The command
prints one line per request handled (:func:`server_app.run.receipts.receipt_line`)
and exits 0 when every pending request is done or refused, 1 when one is still
pending (the engine failed: see its log; run ``forget --pending`` again).
"""

from __future__ import annotations

import sys
from pathlib import Path

from cli.runs import open_inbox
from cli.terminal import TerminalFilter
from server_app.config import ConfigError
from server_app.preflight import validate_run_config
from server_app.run.folder import COMMAND_LOGS
from server_app.run.lock import RunLock
from server_app.run.receipts import receipt_line


def carry_out(folder: Path, prog: str) -> int:
    """Start the engine on ``folder``'s pending requests; return the exit status.

    Raises
    ------
    ConfigError
        A live process holds the run's lock, or the recorded settings no longer
        pass the checks (one line; nothing was started).
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

    claim_run(folder)

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
        print(f"not handled: {', '.join(left)} (flwr exit status {status}; see "
              f"{log_path}); they stay recorded", file=sys.stderr)
        return 1
    print(f"receipts: {folder / 'receipts'}", flush=True)
    return 0

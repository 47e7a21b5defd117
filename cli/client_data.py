"""``client-data``: write each client's own data folder from a built-in dataset.

``client-data --out DIR [--preset NAME] [--run-config "k=v ..."]...`` cuts the
run's partition (``task`` / ``dataset``, ``num-clients``, ``partition``, ``seed``,
``partition-alpha``, ``classes-per-client``, ``block-size``) as the ClientApps
would and writes ``DIR/client-<p>/`` for every partition id ``p``, in the format
of :mod:`task.client_folder` (``records.npz`` + ``manifest.json``). Each folder
holds the whole partition in the partition's order (``client-samples`` is applied
when a run reads it), so a SuperNode started with ``--node-config
"partition-id=<p> client-data='DIR/client-<p>'"`` trains on exactly the rows it
would have cut, and reads nothing else. For demos and tests: a real client's
folder holds its own data, written with :func:`task.client_folder.write_client_folder`.

Run-config keys given that are not the task's are named on stderr, and so is the
refusal a run with exactly these settings would meet. Bad input (a value of the
task's keys, missing data, an infeasible partition, an ``--out`` that is a file
or already holds a client's folder) is one line on stderr, exit status 2, nothing
written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cli import config
from cli.terminal import Parser
from server_app.config import ConfigError, RunConfig
from task.client_folder import ClientDataError, Manifest, write_client_folder
from task.config import TaskConfig, task_spec
from task.data import TaskData, client_data, partitions
from task.registry import load_data, task_of


def folder_name(partition_id: int) -> str:
    """``client-<p>``: the folder of partition id ``p`` under ``--out``."""
    return f"client-{partition_id}"


def parser(prog: str) -> argparse.ArgumentParser:
    """The ``client-data`` command's arguments."""
    ap = Parser(prog=prog, description="Write DIR/client-<p>/ (each "
                "client's own training data, records.npz + "
                "manifest.json) for a run's partition.")
    ap.add_argument("--out", default=None, metavar="DIR",
                    help="where the client-<p> folders go (created; none may exist)")
    ap.add_config_options()
    return ap


def main(argv: list[str], prog: str = "python -m cli client-data") -> int:
    """Write the folders; print one line per client; exit status 0.

    Raises
    ------
    ConfigError
        No ``--out``, an ``--out`` that is a file or already holds a
        ``client-<p>``, a bad run config, data that cannot be found or loaded,
        or a partition that cannot be cut (one line; nothing written).
    """
    args = parser(prog).parse_args(argv)
    if not args.out:
        raise ConfigError("--out DIR is required: the folder the client-<p> folders "
                          "go to")
    out = Path(args.out).expanduser()
    merged = config.resolve(args.preset, args.run_config)
    cfg = task_settings(merged.config)
    _check_out(out, cfg.num_clients)
    data = _load(cfg)
    note = _run_note(merged)  # after every refusal: a note, not a second line
    if note:
        print(f"{prog}: {note}", file=sys.stderr)
    for p in range(cfg.num_clients):
        manifest = write_one(out / folder_name(p), cfg, data, p)
        print(f"{out / folder_name(p)}: {manifest.records} records of "
              f"{manifest.task} (partition-id {p}), sha256 {manifest.sha256[:16]}")
    return 0


def _run_note(merged: config.Merged) -> str:
    """What the command says of the keys it does not read (the run's, not the folders').

    A run with exactly the merged settings is checked too: its refusal is a note
    (the folders depend only on the task's keys, and the run may be given more
    settings), so a bad value given here is not passed over in silence.
    """
    unread = [key for key in merged.overrides if key not in TaskConfig.keys()]
    try:
        RunConfig.from_run_config(merged.config)
    except ConfigError as err:
        return (f"note: a run with exactly these settings would be refused ("
                f"{str(err).splitlines()[0]}); the folders depend on the task's keys "
                "only")
    return f"not read here (a run's keys, not the folders'): {', '.join(unread)}" \
        if unread else ""


def task_settings(run_config: dict) -> TaskConfig:
    """The task's keys of a merged run config (only those: the rest is the run's).

    Raises
    ------
    ConfigError
        A bad value of one of them (one line naming the key).
    """
    try:
        cfg = TaskConfig.from_run_config(run_config)
        task_of(cfg).check_settings(cfg)
    except ValueError as err:
        raise ConfigError(_first_line(err)) from None
    return cfg


def _load(cfg: TaskConfig) -> TaskData:
    """The task's whole data, its partition checked (ConfigError: one line)."""
    task = task_of(cfg)
    try:
        data = load_data(task, cfg, str(task.locate(cfg.data_dir)))
        partitions(data, cfg.num_clients, cfg.partition, cfg.seed, cfg.partition_alpha,
                   cfg.classes_per_client)
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(f"{task_spec(cfg.task, cfg.dataset)}: "
                          f"{_first_line(err)}") from None
    return data


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [""])[0]


def _check_out(out: Path, num_clients: int) -> None:
    """Refuse an ``--out`` that is a file or holds a client's folder (ConfigError)."""
    if os.path.lexists(out) and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file, not a folder")
    taken = [p for p in range(num_clients)  # a dangling link is taken too
             if os.path.lexists(out / folder_name(p))]
    if taken:
        raise ConfigError(f"--out {str(out)!r} already holds {folder_name(taken[0])} "
                          f"({len(taken)} of the {num_clients} client folders): remove "
                          "them or choose another folder")


def write_one(folder: Path, cfg: TaskConfig, data: TaskData, partition_id: int
              ) -> Manifest:
    """Write partition ``partition_id`` of ``data`` (whole, in order) to ``folder``.

    Parameters
    ----------
    folder : Path
        Must not exist.
    cfg : TaskConfig
        The run's task settings (the partition's keys).
    data : TaskData
        The task's whole data.
    partition_id : int
        In ``0 .. num-clients - 1``.

    Returns
    -------
    Manifest

    Raises
    ------
    ConfigError
        The folder cannot be written (one line).
    """
    x, y = client_data(data, partition_id, cfg.num_clients, cfg.partition, cfg.seed,
                       cfg.partition_alpha, cfg.classes_per_client)
    cut = {"num-clients": cfg.num_clients, "partition": cfg.partition, "seed": cfg.seed,
           "partition-alpha": cfg.partition_alpha,
           "classes-per-client": cfg.classes_per_client, "block-size": cfg.block_size}
    try:
        return write_client_folder(folder, x.numpy(), y.numpy(),
                                   task_spec(cfg.task, cfg.dataset), partition_id,
                                   data.num_classes, cut)
    except ClientDataError as err:
        raise ConfigError(str(err)) from None
    except OSError as err:
        raise ConfigError(f"--out: {folder} cannot be written "
                          f"({err.strerror or err})") from None

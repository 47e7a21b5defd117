"""A client's share of the task, cached in its node's folder (``node-dir``).

A ClientApp process of a deployment handles one message and exits, so the
in-process caches of :mod:`task.data` are empty at every message: loading the
whole training set and partitioning it again cost 4-6 s a message on a loaded
2-core machine. :func:`cached_client_data` keeps the client's rows (after the
``client-samples`` cap, before any backdoor stamp) in
``<node-dir>/data-cache/<key>.npz``, the key being a digest of every setting
that decides them (the :class:`~task.config.TaskConfig`, the partition id and
the data folder with its files' sizes and modification times); later messages
read a few arrays instead. Files are written to a temporary name and renamed,
so concurrent ClientApp processes of one node never read half a file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from task.config import TaskConfig
from task.registry import load_client_data, node_folder, task_of

CACHE_DIR = "data-cache"
FORMAT = 1  # bump when the cached content changes meaning


def cached_client_data(cfg: TaskConfig, partition_id: int, server_data_dir: str = "",
                       node_dir: str | Path | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """:func:`task.registry.load_client_data`, cached under ``node_dir`` if given.

    Parameters
    ----------
    cfg, partition_id, server_data_dir :
        As :func:`task.registry.load_client_data`.
    node_dir : str or Path, optional
        The node's folder (node config ``node-dir``); ``None`` or ``""``: no
        file cache, the data is loaded as without this function.

    Returns
    -------
    x, y : torch.Tensor
        As :func:`task.registry.load_client_data` (same values, dtypes and shapes).
    num_classes : int
        The task's number of classes (its ``TaskData.num_classes``).

    Raises
    ------
    ValueError, FileNotFoundError
        As :func:`task.registry.load_client_data` (on a cache miss).
    """
    if not node_dir:
        x, y, task = load_client_data(cfg, partition_id, server_data_dir)
        return x, y, task.num_classes
    folder = node_folder(task_of(cfg), cfg.data_dir, server_data_dir)
    path = Path(node_dir) / CACHE_DIR / f"{cache_key(cfg, partition_id, folder)}.npz"
    try:
        with np.load(path) as saved:
            return (torch.from_numpy(saved["x"]), torch.from_numpy(saved["y"]),
                    int(saved["num_classes"]))
    except (OSError, KeyError, ValueError):  # missing or unreadable: rebuild
        pass
    x, y, task = load_client_data(cfg, partition_id, server_data_dir)
    _write(path, x.numpy(), y.numpy(), task.num_classes)
    return x, y, task.num_classes


def cache_key(cfg: TaskConfig, partition_id: int, folder: str | Path) -> str:
    """Hex digest of the settings and data files that decide a client's rows."""
    folder = Path(folder)
    settings = {k: v for k, v in dataclasses.asdict(cfg).items()
                if k not in ("device", "test_samples", "client_data")}  # rows unchanged
    ident = {"format": FORMAT, "task": settings,
             "partition-id": int(partition_id), "folder": str(folder.resolve()),
             "files": _fingerprint(folder)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str)
                          .encode()).hexdigest()[:32]


def _write(path: Path, x: np.ndarray, y: np.ndarray, num_classes: int) -> None:
    """Save atomically (temporary file, then rename); a failed write only warns."""
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
        tmp = Path(name)
        with os.fdopen(fd, "wb") as out:
            np.savez(out, x=x, y=y, num_classes=np.int64(num_classes))
        os.replace(tmp, path)
    except OSError as err:  # a read-only or full node folder: same data, no cache
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        warnings.warn(f"node-dir data cache not written ({path}): {err}", stacklevel=3)


def _fingerprint(folder: Path) -> list[tuple[str, int, int]]:
    """(name, size, mtime_ns) of the entries directly in ``folder`` ([] if none)."""
    if not folder.is_dir():
        return []
    return sorted((p.name, (st := p.stat()).st_size, st.st_mtime_ns)
                  for p in folder.iterdir())

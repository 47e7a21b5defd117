"""One client's own training data in a folder: the format, writing and reading it.

A SuperNode given ``--node-config "client-data=<folder>"`` trains on that folder
alone and never reads the whole dataset (docs/DEPLOY.md, "Each client with only
its own data"). The folder holds two files:

- ``records.npz``: a plain numpy ``.npz`` (uncompressed, no pickled objects)
  with two arrays: ``x``, the samples, shape (n, ...) in the task's dtype
  (images: uint8 (n, C, H, W); text: int64 (n, T) blocks of character ids), and
  ``y``, int64 targets, shape (n,) class labels or (n, T) next characters.
  Record ``i`` (``x[i]``, ``y[i]``) is the record a request names as id ``i``
  (:mod:`task.records`): the rows are kept in the order given.
- ``manifest.json``: what the arrays are (:class:`Manifest`): the format and its
  version, the task, the partition id the folder belongs to, the record count,
  the number of classes, the arrays' dtypes and shapes, their SHA-256 and, for a
  folder cut from a built-in dataset, the settings it was cut with (``cut``,
  for provenance only; a client's own data has none).

``./simulate.sh client-data`` (:mod:`cli.client_data`) writes one such folder per
client from a run's partition: the same rows in the same order as the partition
the ClientApp would cut (:func:`task.data.client_data`, before the
``client-samples`` cap), so a run whose clients read their folders is
bit-for-bit the run that cuts the partition.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

FORMAT = "sharding-eraser/client-data"
VERSION = 1
ARRAYS = "records.npz"
MANIFEST = "manifest.json"


class ClientDataError(ValueError):
    """A client-data folder that cannot be used: missing, damaged, or another run's.

    The message is one line naming the folder and what is wrong.
    """


@dataclass(frozen=True)
class Manifest:
    """``manifest.json`` of a client-data folder.

    Attributes
    ----------
    task : str
        The task the data is for: a built-in name (``mnist``, ``fmnist``,
        ``cifar10``, ``shakespeare``) or a plug-in's ``package.module:factory``
        (run-config ``task``, or ``dataset`` when ``task`` is ``""``).
    partition_id : int
        The client (node-config ``partition-id``) the folder belongs to.
    records : int
        Records held: ``len(x) == len(y)``, >= 1.
    num_classes : int
        The task's classes (vocabulary size for text): the model's output size.
    x_dtype, y_dtype : str
        numpy dtype names of ``x`` and ``y`` (``y`` is always ``int64``).
    x_shape, y_shape : list of int
        Their shapes; the first axis is ``records``.
    sha256 : str
        64 hex digits: SHA-256 of ``x``'s bytes then ``y``'s (C order), :func:`digest`.
    cut : dict
        How a folder written from a built-in dataset was cut (``num-clients``,
        ``partition``, ``seed``, ``partition-alpha``, ``classes-per-client``,
        ``block-size``); ``{}`` for a client's own data. Not checked against
        the run: a client's records are what the folder holds.
    format, version : str, int
        :data:`FORMAT` and :data:`VERSION`.
    """

    task: str
    partition_id: int
    records: int
    num_classes: int
    x_dtype: str
    x_shape: list[int]
    y_dtype: str
    y_shape: list[int]
    sha256: str
    cut: dict = field(default_factory=dict)
    format: str = FORMAT
    version: int = VERSION

    def to_json(self) -> str:
        """The manifest as JSON text (kebab-case keys, one a line, format first)."""
        fields = asdict(self)
        order = ["format", "version", *[k for k in fields if k not in ("format",
                                                                       "version")]]
        lines = [f' "{k.replace("_", "-")}": {json.dumps(fields[k])}' for k in order]
        return "{\n" + ",\n".join(lines) + "\n}\n"

    @classmethod
    def from_json(cls, text: str, where: str = MANIFEST) -> Manifest:
        """Parse ``manifest.json`` text.

        Raises
        ------
        ClientDataError
            Not JSON, another format or version, or a key missing or of the
            wrong type (one line naming ``where``).
        """
        try:
            raw = json.loads(text)
        except ValueError as err:
            raise ClientDataError(f"{where} is not JSON ({err})") from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ClientDataError(f"{where} is not a {FORMAT} manifest")
        if raw.get("version") != VERSION:
            raise ClientDataError(f"{where} has version {raw.get('version')!r}; this app "
                                  f"reads version {VERSION}")
        kinds = {"task": str, "partition-id": int, "records": int, "num-classes": int,
                 "x-dtype": str, "x-shape": list, "y-dtype": str, "y-shape": list,
                 "sha256": str, "cut": dict}
        for key, kind in kinds.items():
            value = raw.get(key, {} if key == "cut" else None)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ClientDataError(f"{where}: '{key}' = {value!r} is not a "
                                      f"{kind.__name__}")
        if raw["records"] < 1 or raw["num-classes"] < 2:
            raise ClientDataError(f"{where}: records = {raw['records']} and num-classes "
                                  f"= {raw['num-classes']} must be >= 1 and >= 2")
        return cls(**{k.replace("-", "_"): raw.get(k, {}) for k in kinds})


def digest(x: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 (64 hex digits) of ``x``'s bytes then ``y``'s, both in C order."""
    h = hashlib.sha256()
    for a in (x, y):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def manifest_of(x: np.ndarray, y: np.ndarray, task: str, partition_id: int,
                num_classes: int, cut: dict | None = None) -> Manifest:
    """The manifest describing ``x``, ``y`` (arrays of equal first axis, n >= 1).

    Raises
    ------
    ClientDataError
        ``x`` and ``y`` of different lengths, no record, or ``y`` not int64.
    """
    if len(x) != len(y) or len(x) == 0:
        raise ClientDataError(f"client {partition_id}: {len(x)} samples and {len(y)} "
                              "targets (both must be equal and >= 1)")
    if y.dtype != np.int64:
        raise ClientDataError(f"client {partition_id}: targets are {y.dtype}, not int64")
    return Manifest(task=task, partition_id=int(partition_id), records=len(x),
                    num_classes=int(num_classes), x_dtype=str(x.dtype),
                    x_shape=list(x.shape), y_dtype=str(y.dtype), y_shape=list(y.shape),
                    sha256=digest(x, y), cut=dict(cut or {}))


def write_client_folder(folder: str | Path, x: np.ndarray, y: np.ndarray, task: str,
                        partition_id: int, num_classes: int, cut: dict | None = None
                        ) -> Manifest:
    """Write a client-data folder holding ``x``, ``y`` in that order.

    The folder is built under a temporary name beside it and renamed: it either
    exists complete or not at all.

    Parameters
    ----------
    folder : str or Path
        Must not exist yet (its parent is created).
    x : np.ndarray, shape (n, ...)
        Samples, any non-object dtype.
    y : np.ndarray, int64, shape (n,) or (n, T)
        Targets.
    task, partition_id, num_classes, cut :
        As :class:`Manifest`.

    Returns
    -------
    Manifest
        What was written.

    Raises
    ------
    ClientDataError
        ``folder`` exists, or the arrays as :func:`manifest_of` refuses.
    OSError
        The folder cannot be written.
    """
    folder = Path(folder)
    if folder.exists():
        raise ClientDataError(f"{folder} exists already")
    manifest = manifest_of(x, y, task, partition_id, num_classes, cut)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        with open(tmp / ARRAYS, "wb") as out:
            np.savez(out, x=x, y=y)
        (tmp / MANIFEST).write_text(manifest.to_json())
        os.chmod(tmp, 0o755)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def read_client_folder(folder: str | Path) -> tuple[np.ndarray, np.ndarray, Manifest]:
    """A client-data folder's arrays and manifest, checked against each other.

    Cached per process by the files' paths, sizes and modification times (a
    simulated client reads its folder once; a changed file is read again).

    Returns
    -------
    x : np.ndarray, shape (records, ...)
        As the manifest's ``x-dtype`` / ``x-shape`` (the cached array: do not
        write it).
    y : np.ndarray, int64, shape (records,) or (records, T)
    manifest : Manifest

    Raises
    ------
    ClientDataError
        One line naming the folder: it or a file is missing, the manifest is
        malformed, the arrays cannot be read, or their dtypes, shapes, record
        count or SHA-256 differ from the manifest's.
    """
    folder = Path(folder).expanduser()
    try:
        stats = tuple((p.stat().st_size, p.stat().st_mtime_ns)
                      for p in (folder / MANIFEST, folder / ARRAYS))
    except OSError as err:
        raise ClientDataError(f"client-data folder {folder}: "
                              f"{err.strerror or err} ({Path(err.filename or '').name})"
                              ) from None
    return _read(str(folder.resolve()), stats)


@functools.lru_cache(maxsize=8)
def _read(folder: str, stats: tuple) -> tuple[np.ndarray, np.ndarray, Manifest]:
    del stats  # part of the cache key only
    where = Path(folder)
    try:
        manifest = Manifest.from_json((where / MANIFEST).read_text(),
                                      f"{where / MANIFEST}")
        with np.load(where / ARRAYS, allow_pickle=False) as saved:
            x, y = saved["x"], saved["y"]
    except ClientDataError:
        raise
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ClientDataError(f"client-data folder {where}: {ARRAYS} cannot be read "
                              f"({type(err).__name__}: {str(err)[:120]})") from None
    _check_arrays(where, x, y, manifest)
    return x, y, manifest


def _check_arrays(where: Path, x: np.ndarray, y: np.ndarray, manifest: Manifest) -> None:
    """Refuse arrays that are not those the manifest describes (ClientDataError)."""
    found = (str(x.dtype), list(x.shape), str(y.dtype), list(y.shape))
    said = (manifest.x_dtype, manifest.x_shape, manifest.y_dtype, manifest.y_shape)
    if found != said or len(x) != manifest.records or manifest.records < 1:
        raise ClientDataError(
            f"client-data folder {where}: arrays x {found[0]} {tuple(found[1])}, y "
            f"{found[2]} {tuple(found[3])} differ from the manifest's "
            f"{manifest.records} records (x {said[0]} {tuple(said[1])}, y {said[2]} "
            f"{tuple(said[3])})")
    if digest(x, y) != manifest.sha256:
        raise ClientDataError(f"client-data folder {where}: the arrays' SHA-256 "
                              "differs from the manifest's (damaged or changed)")


def check_against_run(manifest: Manifest, where: str | Path, task: str,
                      partition_id: int, block_size: int | None = None) -> None:
    """Refuse a folder that is not this client's data for this run.

    Parameters
    ----------
    manifest : Manifest
        The folder's (checked against its arrays by :func:`read_client_folder`).
    where : str or Path
        The folder, for the message.
    task : str
        The run's task (:func:`task.registry.task_spec` of ``task`` / ``dataset``).
    partition_id : int
        This node's ``partition-id``.
    block_size : int, optional
        The run's ``block-size``, checked for per-position targets (``y`` of
        shape (n, T): T must equal it); None: not checked.

    Raises
    ------
    ClientDataError
        One line naming the folder, the manifest's value and the run's.
    """
    if manifest.task != task:
        raise ClientDataError(f"client-data folder {where} holds task "
                              f"{manifest.task!r} data; this run's task is {task!r}")
    if manifest.partition_id != partition_id:
        raise ClientDataError(f"client-data folder {where} belongs to partition-id "
                              f"{manifest.partition_id}; this node is partition-id "
                              f"{partition_id}")
    if block_size is not None and len(manifest.y_shape) == 2 \
            and manifest.y_shape[1] != block_size:
        raise ClientDataError(f"client-data folder {where} holds blocks of "
                              f"{manifest.y_shape[1]} characters; this run's "
                              f"block-size is {block_size}")


def load_own_data(folder: str | Path, task: str, partition_id: int, cap: int = 0,
                  block_size: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A node's training data from its own folder, as the ClientApp trains on it.

    Parameters
    ----------
    folder : str or Path
        Node-config ``client-data``.
    task, partition_id, block_size :
        As :func:`check_against_run`.
    cap : int
        Run-config ``client-samples``: the first ``cap`` records (0: all), as
        :func:`task.registry.load_client_data` caps a cut partition.

    Returns
    -------
    x, y : torch.Tensor
        The folder's first ``cap`` records (dtypes and shapes as stored; the
        tensors share the cached arrays' memory, as :func:`task.data.client_data`'s
        cached rows do: do not write them).
    num_classes : int

    Raises
    ------
    ClientDataError
        As :func:`read_client_folder` and :func:`check_against_run`.
    """
    x, y, manifest = read_client_folder(folder)
    check_against_run(manifest, folder, task, partition_id, block_size)
    limit = cap or None
    return (torch.from_numpy(x[:limit]), torch.from_numpy(y[:limit]),
            manifest.num_classes)

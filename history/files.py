"""Files that must never be half-written: atomic writes of named numpy arrays.

Used by the client's slice store and the server's history store alike.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np


def encode_arrays(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Serialise named arrays to ``.npz`` bytes (no pickle)."""
    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
    return buffer.getvalue()


def decode_arrays(data: bytes) -> dict[str, np.ndarray]:
    """Inverse of :func:`encode_arrays`; keeps the stored key order."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a fsync'ed temporary file and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """:func:`atomic_write` of :func:`encode_arrays`; creates the parent folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, encode_arrays(arrays))


def read_arrays(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of an ``.npz`` file, or None if there is no such file."""
    return decode_arrays(path.read_bytes()) if path.is_file() else None

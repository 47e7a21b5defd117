"""Files that must never be half-written: atomic writes of named numpy arrays.

Used by the client's slice store and the server's history store alike. Reading
never trusts the bytes: anything that does not parse as an ``.npz`` archive of
plain arrays (truncated, garbled, another format) raises :class:`DamagedFileError`.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np


class DamagedFileError(ValueError):
    """Stored bytes that cannot be read back as the named arrays they should hold."""


def encode_arrays(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Serialise named arrays to ``.npz`` bytes (no pickle)."""
    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
    return buffer.getvalue()


def decode_arrays(data: bytes) -> dict[str, np.ndarray]:
    """Inverse of :func:`encode_arrays`; keeps the stored key order.

    Raises
    ------
    DamagedFileError
        ``data`` is not an ``.npz`` archive of plain (non-object) arrays.
    """
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    # damaged bytes fail in many ways (BadZipFile, ValueError, EOFError, a
    # tokenizer error from a garbled header, an unknown compression method, an
    # AttributeError for a bare .npy): all of them are damage
    except Exception as err:
        raise DamagedFileError(f"not a readable .npz archive of {len(data)} bytes "
                               f"({type(err).__name__}: {err})") from err


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
    """The arrays of an ``.npz`` file, or None if there is no such file.

    Raises
    ------
    DamagedFileError
        The file exists but cannot be read or decoded; the message names it.
    """
    if not path.is_file():
        return None
    try:
        return decode_arrays(path.read_bytes())
    except (OSError, DamagedFileError) as err:
        raise DamagedFileError(f"{path.name}: {err}") from err

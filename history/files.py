"""Files that must never be half-written: atomic writes of named numpy arrays.

Used by the client's slice store and the server's history store alike. Reading
never trusts the bytes: anything that does not parse as an archive of plain
arrays (truncated, garbled, another format) raises :class:`DamagedFileError`.

Names are data, not keywords. An archive is a zip (numpy's ``.npz`` container,
uncompressed) whose members are a manifest ``names.json`` (the names as a JSON
list, ASCII, in order) and the arrays as ``0.npy``, ``1.npy``, ... (numpy's
``.npy`` format, in the manifest's order). No name ever becomes a keyword of
``np.savez`` or a zip member's name, so any ``str`` a ``torch.nn.Module`` can
give a parameter (``allow_pickle``, ``file``, ``a/b``, ``arr_0``, unicode) is
kept exactly. Files of the older format (``np.savez(buffer, **arrays)``: one
``<name>.npy`` member per array, no manifest) are still read: ``np.savez`` names
every member ``*.npy``, so a member ``names.json`` tells the formats apart.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

MANIFEST = "names.json"
"""Zip member holding the names; never a member name of ``np.savez`` (``*.npy``)."""

_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed member times: the same arrays, the same bytes


class DamagedFileError(ValueError):
    """Stored bytes that cannot be read back as the named arrays they should hold."""


def encode_arrays(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Serialise named arrays to archive bytes (manifest + ``.npy`` members, no pickle).

    Parameters
    ----------
    arrays : Mapping[str, np.ndarray]
        Name -> array of any shape (0-d and empty too) and any non-object dtype;
        names are any ``str``, kept exactly and in order.

    Returns
    -------
    bytes
        The archive; equal arrays under equal names give equal bytes.

    Raises
    ------
    TypeError
        A name that is not a ``str``.
    ValueError
        An object array (it would need pickle).
    """
    names = list(arrays)
    bad = next((n for n in names if not isinstance(n, str)), None)
    if bad is not None:
        raise TypeError(f"array name {bad!r} is not allowed: names must be str")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        archive.writestr(zipfile.ZipInfo(MANIFEST, _EPOCH),
                         json.dumps(names, ensure_ascii=True))
        for i, name in enumerate(names):
            # force_zip64 as np.savez does: the member's size is not known up front
            with archive.open(zipfile.ZipInfo(f"{i}.npy", _EPOCH), "w",
                              force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(arrays[name]),
                                          allow_pickle=False)
    return buffer.getvalue()


def decode_arrays(data: bytes) -> dict[str, np.ndarray]:
    """Inverse of :func:`encode_arrays`; keeps the stored names and their order.

    Also reads the older format (``np.savez`` with the names as keywords).

    Raises
    ------
    DamagedFileError
        ``data`` is not an archive of plain (non-object) arrays, or its manifest
        and members disagree.
    """
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            if MANIFEST in archive.namelist():
                return _read_manifest(archive)
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:  # older format
            return {k: npz[k] for k in npz.files}
    # damaged bytes fail in many ways (BadZipFile, ValueError, EOFError, a
    # tokenizer error from a garbled header, an unknown compression method, an
    # AttributeError for a bare .npy): all of them are damage
    except Exception as err:
        raise DamagedFileError(f"not a readable .npz archive of {len(data)} bytes "
                               f"({type(err).__name__}: {err})") from err


def _read_manifest(archive: zipfile.ZipFile) -> dict[str, np.ndarray]:
    """The arrays of a manifest archive, checked member by member."""
    names = json.loads(archive.read(MANIFEST).decode("ascii"))
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) \
            or len(set(names)) != len(names):
        raise ValueError(f"{MANIFEST} is not a list of distinct names")
    members = [MANIFEST] + [f"{i}.npy" for i in range(len(names))]
    if archive.namelist() != members:
        raise ValueError(f"{MANIFEST} names {len(names)} arrays, the archive holds "
                         f"members {archive.namelist()[:5]}...")
    out = {}
    for i, name in enumerate(names):
        with archive.open(f"{i}.npy") as member:
            out[name] = np.lib.format.read_array(member, allow_pickle=False)
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def readable_mode() -> int:
    """Permission bits of a file others may read: 0o666 less the process's umask."""
    return 0o666 & ~_umask()


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` via a fsync'ed temporary file and a rename.

    ``mode``: the file's permission bits; None keeps the temporary file's 0o600
    (private: history, models, slices). Reports a reader outside this process
    takes (summary.json, receipts, exported models) pass :func:`readable_mode`.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        if mode is not None:
            os.fchmod(fd, mode)
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

"""The ``node-dir`` copy of a client's coded slices: files that survive a restart.

Layout of ``<node-dir>/slices/<store>/`` (every file written to a temporary
file, fsync'ed and renamed; see :mod:`history.files`):

- ``round-<g>.npz``: ``slice`` (uint32, (B,)), ``tags`` (uint8, (S, 32)) and a
  copy of the access keys, ``keys`` (uint8, (S, 32)) and ``slice_index``
  (int64 scalar), so that a damaged ``access.npz`` costs no round;
- ``access.npz``: ``keys`` and ``slice_index``;
- ``nonces.npz``: ``nonces`` (uint8, (m, 32)), the SHA-256 of every nonce answered.

Nothing read back is trusted: a file that is truncated, garbled, not an
``.npz`` archive, or holds arrays of the wrong name, dtype or shape raises
:class:`history.files.DamagedFileError` naming the file and the fault. The
caller then loses exactly what that file holds (see :mod:`history.coded.slices`).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from history.files import DamagedFileError, atomic_write_arrays, read_arrays

TAG_BYTES = 32
"""Bytes of an HMAC-SHA256 tag, an access key and a nonce digest."""

_ROUND_FILE = re.compile(r"^round-(\d+)\.npz$")

Access = tuple[int, list[bytes]]
"""(slice index, access keys: one 32-byte key per shard)."""


def _describe(value: object) -> str:
    if value is None:
        return "missing"
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    return type(value).__name__


def _rows(saved: dict, name: str, path: Path, allow_empty: bool = False) -> list[bytes]:
    """``saved[name]`` as a list of 32-byte rows; DamagedFileError if it is not one."""
    value = saved.get(name)
    if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim != 2 \
            or value.shape[1] != TAG_BYTES or (value.shape[0] == 0 and not allow_empty):
        raise DamagedFileError(f"{path.name}: {name!r} is {_describe(value)}, expected "
                               f"uint8 rows of {TAG_BYTES} bytes")
    return [bytes(row) for row in value]


def _access(saved: dict, path: Path) -> Access:
    keys = _rows(saved, "keys", path)
    index = saved.get("slice_index")
    if not isinstance(index, np.ndarray) or index.shape != () or \
            index.dtype.kind not in "iu" or int(index) < 0:
        raise DamagedFileError(f"{path.name}: 'slice_index' is {_describe(index)}, "
                               "expected an integer scalar >= 0")
    return int(index), keys


def _pack(rows: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), TAG_BYTES)


class SliceFolder:
    """One coded store's folder under ``<node-dir>/slices/``.

    Parameters
    ----------
    path : Path
        ``<node-dir>/slices/<store>``; created on the first write.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def round_path(self, rnd: int) -> Path:
        """``round-<rnd>.npz``."""
        return self.path / f"round-{rnd}.npz"

    def write_round(self, rnd: int, data: np.ndarray, tags: list[bytes],
                    access: Access) -> None:
        """Keep round ``rnd``'s slice (uint32 (B,)), tags and a copy of the access keys."""
        index, keys = access
        atomic_write_arrays(self.round_path(rnd), {
            "slice": data, "tags": _pack(tags), "keys": _pack(keys),
            "slice_index": np.int64(index)})

    def write_access(self, access: Access) -> None:
        """Write ``access.npz`` unless it already holds these keys (intact)."""
        try:
            if self.read_access() == access:
                return
        except DamagedFileError:
            pass  # rewritten below: the damage is repaired
        index, keys = access
        atomic_write_arrays(self.path / "access.npz",
                            {"keys": _pack(keys), "slice_index": np.int64(index)})

    def read_round(self, rnd: int) -> tuple[np.ndarray, list[bytes]] | None:
        """Round ``rnd``'s slice (uint32 (B,)) and tags, or None without a file.

        Raises
        ------
        DamagedFileError
            The file is unreadable or its ``slice`` / ``tags`` are malformed.
        """
        path = self.round_path(rnd)
        saved = read_arrays(path)
        if saved is None:
            return None
        data = saved.get("slice")
        if not isinstance(data, np.ndarray) or data.dtype != np.uint32 or \
                data.ndim != 1 or data.size == 0:
            raise DamagedFileError(f"{path.name}: 'slice' is {_describe(data)}, "
                                   "expected a non-empty 1-d uint32 array")
        return data, _rows(saved, "tags", path)

    def read_access(self) -> Access | None:
        """``access.npz``'s (slice index, keys), or None without a file.

        Raises
        ------
        DamagedFileError
            The file is unreadable or malformed.
        """
        path = self.path / "access.npz"
        saved = read_arrays(path)
        return None if saved is None else _access(saved, path)

    def access_from_rounds(self) -> list[Access]:
        """The distinct access copies of every readable round file, by round."""
        found: list[Access] = []
        for _, path in self.round_files():
            try:
                saved = read_arrays(path)
                access = _access(saved, path) if saved is not None else None
            except DamagedFileError:
                continue  # reported when that round is asked for
            if access is not None and access not in found:
                found.append(access)
        return found

    def round_files(self) -> list[tuple[int, Path]]:
        """(round, path) of every ``round-<g>.npz``, ascending round."""
        if not self.path.is_dir():
            return []
        files = [(int(m.group(1)), p) for p in self.path.iterdir()
                 if (m := _ROUND_FILE.match(p.name))]
        return sorted(files)

    def read_nonces(self) -> set[bytes]:
        """SHA-256 digests of the nonces answered before (empty without a file).

        Raises
        ------
        DamagedFileError
            The file is unreadable or malformed.
        """
        path = self.path / "nonces.npz"
        saved = read_arrays(path)
        return set() if saved is None else set(_rows(saved, "nonces", path,
                                                     allow_empty=True))

    def write_nonces(self, digests: set[bytes]) -> None:
        """Replace ``nonces.npz`` with ``digests`` (32 bytes each)."""
        atomic_write_arrays(self.path / "nonces.npz", {"nonces": _pack(sorted(digests))})

    def disk_bytes(self) -> int:
        """Bytes of this store's files (temporary files not counted)."""
        if not self.path.is_dir():
            return 0
        return sum(p.stat().st_size for p in self.path.iterdir()
                   if p.is_file() and not p.name.startswith("."))

"""Which data a run read: the source files, their format and checksums.

A run's accuracy is only comparable with runs on the same data: the CIFAR-10 JPEG
copy (quality about 75) is not the canonical images. A built-in task's module
says which files its data is read from and in which format (its ``provenance``);
:func:`files_provenance` records them with their SHA-256 (cached by path, size and
modification time, in memory and in ``<cache root>/provenance.json``, so a file
is hashed once).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from task.locate import cache_root

_MEMO: dict[tuple[str, int, int], str] = {}


def files_provenance(dataset: str, folder: str | Path, fmt: str,
                     files: Sequence[Path]) -> dict:
    """The data a run of ``dataset`` from ``folder`` reads (summary.json ``data``).

    Parameters
    ----------
    dataset : str
        The task's name.
    folder : str or Path
        The data folder (``files`` lie under it).
    fmt : str
        One sentence: the format read (and whether it is the canonical copy).
    files : sequence of Path
        The files read; those that do not exist are left out.

    Returns
    -------
    dict
        ``dataset``, ``folder``, ``format``, ``files`` (one dict per file:
        ``path`` relative to ``folder``, ``bytes``, ``sha256``) and ``sha256``
        (of the files' checksums in order: one id for the whole set).

    Raises
    ------
    FileNotFoundError
        None of ``files`` exists.
    """
    files = [f for f in files if f.is_file()]
    if not files:
        raise FileNotFoundError(f"no {dataset} files in {folder}")
    entries = [{"path": str(f.relative_to(folder)), "bytes": f.stat().st_size,
                "sha256": file_sha256(f)} for f in files]
    whole = hashlib.sha256("".join(e["sha256"] for e in entries).encode()).hexdigest()
    return {"dataset": dataset, "folder": str(folder), "format": fmt,
            "files": entries, "sha256": whole}


def file_sha256(path: Path) -> str:
    """SHA-256 of a file (hex), cached by absolute path, size and mtime."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key in _MEMO:
        return _MEMO[key]
    cache = _load_cache()
    name = "|".join(map(str, key))
    digest = cache.get(name)
    if digest is None:
        sha = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                sha.update(chunk)
        digest = cache[name] = sha.hexdigest()
        _save_cache(cache)
    _MEMO[key] = digest
    return digest


def _cache_path() -> Path:
    return cache_root() / "provenance.json"


def _load_cache() -> dict:
    try:
        return json.loads(_cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _save_cache(cache: dict) -> None:
    """Write the checksum cache atomically; an unwritable cache is skipped."""
    path = _cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(cache, f)
        os.replace(tmp, path)
    except OSError:
        pass

"""Which data a run read: the source files, their format and checksums.

A run's accuracy is only comparable with runs on the same data: the CIFAR-10 JPEG
copy (quality about 75) is not the canonical images. :func:`data_provenance`
names the files a dataset is read from, their format and SHA-256 (cached by path,
size and modification time, in memory and in ``<cache root>/provenance.json``, so
a file is hashed once).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from task.locate import CIFAR_PICKLES, CIFAR_TAR, cache_root

_FORMATS = {
    "mnist": "MNIST IDX files (uncompressed), read by torchvision.datasets.MNIST",
    "fmnist": "Fashion-MNIST IDX files (uncompressed), read by "
              "torchvision.datasets.FashionMNIST",
    "cifar10-pickles": "canonical CIFAR-10 python pickles (cifar-10-batches-py)",
    "cifar10-jpeg": "CIFAR-10 JPEG copy (quality about 75, decoded once to .npy): "
                    "not bit-identical to the canonical images; accuracy is not "
                    "comparable with runs on them",
    "shakespeare": "Tiny Shakespeare, one UTF-8 text file (char-rnn input.txt)",
}
_MEMO: dict[tuple[str, int, int], str] = {}


def source_files(dataset: str, folder: str | Path) -> tuple[str, list[Path]]:
    """The format key of :data:`_FORMATS` and the files ``dataset`` is read from.

    Raises
    ------
    FileNotFoundError
        ``folder`` holds none of the dataset's files.
    """
    folder = Path(folder)
    if dataset in ("mnist", "fmnist"):
        raw = folder / ("MNIST" if dataset == "mnist" else "FashionMNIST") / "raw"
        key, files = dataset, sorted(raw.glob("*-ubyte"))
    elif dataset == "cifar10" and (folder / CIFAR_PICKLES / "data_batch_1").is_file():
        key = "cifar10-pickles"
        files = sorted((folder / CIFAR_PICKLES).glob("*_batch*"))
    elif dataset == "cifar10":
        key, files = "cifar10-jpeg", [folder / CIFAR_TAR]
    else:
        key, files = dataset, [folder / "tinyshakespeare" / "input.txt"]
    files = [f for f in files if f.is_file()]
    if not files:
        raise FileNotFoundError(f"no {dataset} files in {folder}")
    return key, files


def data_provenance(dataset: str, folder: str | Path) -> dict:
    """The data a run of ``dataset`` from ``folder`` reads.

    Returns
    -------
    dict
        ``dataset``, ``folder``, ``format`` (a sentence), ``files`` (one dict per
        file: ``path`` relative to ``folder``, ``bytes``, ``sha256``) and
        ``sha256`` (of the files' checksums in order: one id for the whole set).

    Raises
    ------
    FileNotFoundError
        ``folder`` holds none of the dataset's files.
    """
    key, files = source_files(dataset, folder)
    entries = [{"path": str(f.relative_to(folder)), "bytes": f.stat().st_size,
                "sha256": file_sha256(f)} for f in files]
    whole = hashlib.sha256("".join(e["sha256"] for e in entries).encode()).hexdigest()
    return {"dataset": dataset, "folder": str(folder), "format": _FORMATS[key],
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

"""Where a built-in task's files are: an explicit folder, the usual places, or a download.

A built-in task describes its files with a :class:`DataSource` (marker files that
show a folder holds them, and how to download the canonical copy);
:func:`resolve_data_dir` finds a folder that really holds them (checking marker
files, reading nothing) and :func:`holds_dataset` says whether a folder does.
Nothing here knows a dataset: the facts are the task modules' (:mod:`task.tasks`).
"""

from __future__ import annotations

import logging
import os
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from task.config import PROJECT_ROOT

log = logging.getLogger(__name__)

SHARED_DATA_DIR = PROJECT_ROOT.parent / "shared" / "data"
"""Offline copies kept next to the project (``<project root>/../shared/data``)."""


@dataclass(frozen=True)
class DataSource:
    """A built-in dataset's files under a data folder.

    Attributes
    ----------
    name : str
        The dataset's name (messages and the log).
    markers : tuple of Path
        Files relative to a data folder; a folder holds the dataset if any one
        of them is there.
    download : callable
        ``download(root: Path) -> None``: fetch the canonical copy into ``root``
        (needs internet); raise on failure.
    """

    name: str
    markers: tuple[Path, ...]
    download: Callable[[Path], None]


class DatasetNotFoundError(FileNotFoundError):
    """No usable copy of a dataset was found; the message lists every place looked."""


def cache_root() -> Path:
    """The user cache: ``$SE_CACHE_DIR`` or ``~/.cache/sharding-eraser``.

    Returns
    -------
    Path
        Not created here.  Downloads go to ``<cache root>/data``; the CIFAR-10
        JPEG copy is extracted and decoded under ``<cache root>/cifar10-jpeg``.
    """
    env = os.environ.get("SE_CACHE_DIR", "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sharding-eraser"


def _holds(source: DataSource, folder: Path) -> bool:
    return any((folder / marker).is_file() for marker in source.markers)


def holds_dataset(source: DataSource, folder: str) -> bool:
    """Whether ``folder`` (relative: from the project root) holds ``source``'s files.

    Checks the marker files :func:`resolve_data_dir` looks for; reads nothing.
    """
    return bool(folder) and _holds(source, _as_dir(folder))


def _as_dir(value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else PROJECT_ROOT / path


def _download(source: DataSource, root: Path) -> None:
    """Fetch the canonical copy into ``root`` (needs internet); raises on failure."""
    root.mkdir(parents=True, exist_ok=True)
    source.download(root)


def download_file(url: str, target: Path) -> None:
    """Fetch ``url`` into ``target`` atomically (a helper of the tasks' ``download``).

    Raises
    ------
    OSError
        The fetch or the write failed (``urllib.error.URLError`` is one).
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url, timeout=30) as response:
        payload = response.read()
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
    with os.fdopen(fd, "wb") as handle:
        handle.write(payload)
    os.replace(tmp, target)


def resolve_data_dir(source: DataSource, data_dir: str | None = None) -> Path:
    """Find a folder that really holds ``source``'s files.

    An explicit ``data_dir`` (run-config key ``data-dir``; ``None`` or ``""`` =
    unset; a relative path is taken from the project root) is the only place
    looked: if it does not hold the dataset that is an error, never a silent
    switch to another folder.  Unset, candidates in order (the first one
    holding the dataset wins):

    1. environment variable ``SE_DATA_DIR``;
    2. ``<project root>/../shared/data`` (:data:`SHARED_DATA_DIR`);
    3. the user cache ``<cache root>/data`` (:func:`cache_root`), where the
       canonical copy is downloaded with ``download=True`` if it is not there
       yet (needs internet).

    A folder holds the dataset if it has one of ``source.markers`` (each task
    module names its files, e.g. ``MNIST/raw/train-images-idx3-ubyte``).

    Parameters
    ----------
    source : DataSource
        The task's files (its module's).
    data_dir : str or None
        Explicit folder.

    Returns
    -------
    Path
        The folder (the parent of ``MNIST/``, ``cifar10-jpeg/``...).

    Raises
    ------
    DatasetNotFoundError
        If an explicit ``data_dir`` does not hold the dataset (one line naming
        ``data-dir``), or no candidate holds it and the download failed (the
        message lists every candidate and why it was rejected).
    """
    dataset = source.name
    if data_dir:
        return _explicit_dir(source, data_dir)
    looked: list[str] = ["data-dir argument: (unset)"]
    folder = _first_candidate(source, looked)
    if folder is None:
        folder = _user_cache(source, looked)
    if folder is None:
        raise DatasetNotFoundError(
            f"dataset {dataset!r} not found; looked in:\n  " + "\n  ".join(looked)
        )
    return folder


def _wanted(source: DataSource) -> str:
    return " or ".join(str(m) for m in source.markers)


def _explicit_dir(source: DataSource, data_dir: str) -> Path:
    """The explicit ``data-dir``, or a one-line DatasetNotFoundError naming it."""
    folder, dataset = _as_dir(data_dir), source.name
    if not _holds(source, folder):
        raise DatasetNotFoundError(
            f"run-config 'data-dir' = {data_dir!r} is not allowed: {folder} does "
            f"not hold {dataset} (no {_wanted(source)}); give a folder that does, "
            "or '' to look in $SE_DATA_DIR, ../shared/data and the user cache")
    return folder


def _first_candidate(source: DataSource, looked: list[str]) -> Path | None:
    """``$SE_DATA_DIR``, then the shared copy; appends each rejected one to ``looked``."""
    dataset = source.name
    candidates = [
        ("SE_DATA_DIR", os.environ.get("SE_DATA_DIR", "")),
        ("shared copy", str(SHARED_DATA_DIR)),
    ]
    for label, value in candidates:
        if not value:
            looked.append(f"{label}: (unset)")
            continue
        folder = _as_dir(value)
        if _holds(source, folder):
            log.debug("Using %s of %s: %s", label, dataset, folder)
            return folder
        looked.append(f"{label}: {folder} (no {_wanted(source)})")
        if label != "shared copy":
            log.warning("%s %s does not hold %s; looking further",
                        label, folder, dataset)
    return None


def _user_cache(source: DataSource, looked: list[str]) -> Path | None:
    """The user cache, downloading into it if needed; appends why not to ``looked``."""
    cache, dataset = cache_root() / "data", source.name
    if _holds(source, cache):
        log.debug("Using user cache of %s: %s", dataset, cache)
        return cache
    try:
        _download(source, cache)
    except Exception as error:  # noqa: BLE001 - any failure means "not available"
        reason = " ".join(str(error).split())
        looked.append(f"user cache: {cache} (not there; download failed: "
                      f"{type(error).__name__}: {reason})")
        return None
    if _holds(source, cache):
        log.info("Downloaded %s into the user cache %s", dataset, cache)
        return cache
    looked.append(f"user cache: {cache} (download left no {_wanted(source)})")
    return None

"""Where the datasets are: an explicit folder, the usual places, or a download.

:func:`resolve_data_dir` finds a folder that really holds a dataset (checking
marker files, reading nothing); :func:`node_data_dir` is a ClientApp's choice
between the server's folder and its own run-config ``data-dir``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import urllib.request
from pathlib import Path

from task.config import PROJECT_ROOT, check_dataset

log = logging.getLogger(__name__)

SHARED_DATA_DIR = PROJECT_ROOT.parent / "shared" / "data"
"""Offline copies kept next to the project (``<project root>/../shared/data``)."""

CIFAR_TAR = Path("cifar10-jpeg") / "cifar10-jpg.tar.gz"
"""The CIFAR-10 JPEG copy, relative to a data folder."""

CIFAR_PICKLES = Path("cifar-10-batches-py")
"""The canonical CIFAR-10 pickles, relative to a data folder."""

_MARKERS = {
    "mnist": (Path("MNIST/raw/train-images-idx3-ubyte"),),
    "fmnist": (Path("FashionMNIST/raw/train-images-idx3-ubyte"),),
    "cifar10": (CIFAR_PICKLES / "data_batch_1", CIFAR_TAR),
    "shakespeare": (Path("tinyshakespeare/input.txt"),),
}
_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
    "tinyshakespeare/input.txt"
)


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


def _holds(dataset: str, folder: Path) -> bool:
    return any((folder / marker).is_file() for marker in _MARKERS[dataset])


def holds_dataset(dataset: str, folder: str) -> bool:
    """Whether ``folder`` (relative: from the project root) holds ``dataset``.

    Checks the marker files :func:`resolve_data_dir` looks for; reads nothing.
    Raises ValueError naming ``dataset`` if it is unknown.
    """
    check_dataset(dataset)
    return bool(folder) and _holds(dataset, _as_dir(folder))


def node_data_dir(dataset: str, explicit: str, server: str) -> str | None:
    """The data folder of a client node.

    Parameters
    ----------
    dataset : str
        One of :data:`task.config.DATASETS`.
    explicit : str
        The run-config ``data-dir`` (``""`` = unset).
    server : str
        The server's folder (message ``config["data-dir"]``; ``""`` = none).

    Returns
    -------
    str or None
        ``server`` where it holds the dataset on this node too; else
        ``explicit`` (an error naming ``data-dir`` later if this node does not
        have it there, never another folder); else ``None``: the lookup order
        of :func:`resolve_data_dir`.
    """
    if server and holds_dataset(dataset, server):
        return server
    return explicit or None


def _as_dir(value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else PROJECT_ROOT / path


def _download(dataset: str, root: Path) -> None:
    """Fetch the canonical copy into ``root`` (needs internet); raises on failure."""
    import torchvision

    root.mkdir(parents=True, exist_ok=True)
    if dataset == "mnist":
        torchvision.datasets.MNIST(str(root), train=True, download=True)
        torchvision.datasets.MNIST(str(root), train=False, download=True)
    elif dataset == "fmnist":
        torchvision.datasets.FashionMNIST(str(root), train=True, download=True)
        torchvision.datasets.FashionMNIST(str(root), train=False, download=True)
    elif dataset == "cifar10":
        torchvision.datasets.CIFAR10(str(root), train=True, download=True)
    else:
        target = root / "tinyshakespeare" / "input.txt"
        target.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(_SHAKESPEARE_URL, timeout=30) as response:
            payload = response.read()
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
        os.replace(tmp, target)


def resolve_data_dir(dataset: str, data_dir: str | None = None) -> Path:
    """Find a folder that really holds ``dataset``.

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

    A folder holds MNIST if it has ``MNIST/raw/train-images-idx3-ubyte``,
    Fashion-MNIST ``FashionMNIST/raw/train-images-idx3-ubyte``, CIFAR-10
    ``cifar-10-batches-py/data_batch_1`` or ``cifar10-jpeg/cifar10-jpg.tar.gz``,
    Tiny Shakespeare ``tinyshakespeare/input.txt``.

    Parameters
    ----------
    dataset : str
        One of :data:`task.config.DATASETS`.
    data_dir : str or None
        Explicit folder.

    Returns
    -------
    Path
        The folder (the parent of ``MNIST/``, ``cifar10-jpeg/``...).

    Raises
    ------
    ValueError
        If ``dataset`` is unknown.
    DatasetNotFoundError
        If an explicit ``data_dir`` does not hold the dataset (one line naming
        ``data-dir``), or no candidate holds it and the download failed (the
        message lists every candidate and why it was rejected).
    """
    check_dataset(dataset)
    if data_dir:
        return _explicit_dir(dataset, data_dir)
    looked: list[str] = ["data-dir argument: (unset)"]
    folder = _first_candidate(dataset, looked)
    if folder is None:
        folder = _user_cache(dataset, looked)
    if folder is None:
        raise DatasetNotFoundError(
            f"dataset {dataset!r} not found; looked in:\n  " + "\n  ".join(looked)
        )
    return folder


def _wanted(dataset: str) -> str:
    return " or ".join(str(m) for m in _MARKERS[dataset])


def _explicit_dir(dataset: str, data_dir: str) -> Path:
    """The explicit ``data-dir``, or a one-line DatasetNotFoundError naming it."""
    folder = _as_dir(data_dir)
    if not _holds(dataset, folder):
        raise DatasetNotFoundError(
            f"run-config 'data-dir' = {data_dir!r} is not allowed: {folder} does "
            f"not hold {dataset} (no {_wanted(dataset)}); give a folder that does, "
            "or '' to look in $SE_DATA_DIR, ../shared/data and the user cache")
    return folder


def _first_candidate(dataset: str, looked: list[str]) -> Path | None:
    """``$SE_DATA_DIR``, then the shared copy; appends each rejected one to ``looked``."""
    candidates = [
        ("SE_DATA_DIR", os.environ.get("SE_DATA_DIR", "")),
        ("shared copy", str(SHARED_DATA_DIR)),
    ]
    for label, value in candidates:
        if not value:
            looked.append(f"{label}: (unset)")
            continue
        folder = _as_dir(value)
        if _holds(dataset, folder):
            log.debug("Using %s of %s: %s", label, dataset, folder)
            return folder
        looked.append(f"{label}: {folder} (no {_wanted(dataset)})")
        if label != "shared copy":
            log.warning("%s %s does not hold %s; looking further",
                        label, folder, dataset)
    return None


def _user_cache(dataset: str, looked: list[str]) -> Path | None:
    """The user cache, downloading into it if needed; appends why not to ``looked``."""
    cache = cache_root() / "data"
    if _holds(dataset, cache):
        log.debug("Using user cache of %s: %s", dataset, cache)
        return cache
    try:
        _download(dataset, cache)
    except Exception as error:  # noqa: BLE001 - any failure means "not available"
        reason = " ".join(str(error).split())
        looked.append(f"user cache: {cache} (not there; download failed: "
                      f"{type(error).__name__}: {reason})")
        return None
    if _holds(dataset, cache):
        log.info("Downloaded %s into the user cache %s", dataset, cache)
        return cache
    looked.append(f"user cache: {cache} (download left no {_wanted(dataset)})")
    return None

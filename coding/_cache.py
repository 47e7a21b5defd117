"""numba's on-disk cache of the kernels, found by the kernels' content, not their folder.

numba keys the cache of a ``cache=True`` function by the folder of its source file.
Flower runs the app from a copy (the FAB) unpacked under ``$FLWR_HOME``, and
``./simulate.sh`` gives each run a FLWR_HOME of its own, so every coded run
compiled the kernels again (10-15 s on 2 cores) although the install step had
compiled them (:mod:`coding.warmup`). :class:`ContentCacheLocator` puts the cache
of :mod:`coding._kernels` in ``<sys.prefix>/var/sharding-eraser/numba/<sha256 of
the file, 16 hex digits>``: one folder for every copy of the same code, another
as soon as the code changes. numba still checks each entry against the file's
content and its own version.

This uses numba's cache-locator classes (``numba.core.caching``, 0.60 to 0.68),
which are not public API: with a numba that lacks them, or where the folder
cannot be written, numba's own locator is used (the cache beside the code).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

KERNELS = "_kernels.py"
"""The one source file whose functions this locator serves."""


def cache_root() -> Path:
    """``<sys.prefix>/var/sharding-eraser/numba``: the environment's cache of kernels."""
    return Path(sys.prefix) / "var" / "sharding-eraser" / "numba"


def cache_folder(source: str | os.PathLike) -> Path:
    """The cache folder of the kernels in ``source``: :func:`cache_root` / content hash.

    Raises
    ------
    OSError
        ``source`` cannot be read.
    """
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16]
    return cache_root() / digest


def _locator_class():
    """The locator class for numba, or None where numba's caching internals differ."""
    try:
        from numba.core.caching import UserProvidedCacheLocator
    except ImportError:
        return None

    class ContentCacheLocator(UserProvidedCacheLocator):
        """numba's locator for :data:`KERNELS`: the cache folder by content."""

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = str(cache_folder(py_file))

        @classmethod
        def from_function(cls, py_func, py_file):
            path = Path(py_file)
            if path.name != KERNELS or path.parent != Path(__file__).parent:
                return None  # not ours: numba's own locators
            try:
                self = cls(py_func, py_file)
                self.ensure_cache_path()
            except OSError:
                return None
            return self

    return ContentCacheLocator


def install() -> bool:
    """Put the content locator first in numba's list (once); whether it is in use.

    Call before the kernels are defined: numba picks a function's locator when
    ``@njit(cache=True)`` wraps it.
    """
    try:
        from numba.core.caching import CacheImpl
    except ImportError:
        return False
    locators = getattr(CacheImpl, "_locator_classes", None)
    if not isinstance(locators, list):
        return False
    if any(getattr(c, "__name__", "") == "ContentCacheLocator" for c in locators):
        return True
    locator = _locator_class()
    if locator is None:
        return False
    locators.insert(0, locator)
    return True

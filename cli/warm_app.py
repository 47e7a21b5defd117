"""The ClientApp of an installed FAB, installed and imported once per SuperExec.

Flower 1.42's ClientApp process (``run_clientapp``) unpacks the FAB and checks
every file's SHA-256 at every message, then imports the ClientApp module. A
warm SuperExec (:mod:`cli.warm_exec`) forks that process per message, so both
can be done once:

- :func:`cached_install` (in each forked child): the first child to install a
  FAB writes the FAB's full SHA-256 into the installed folder (``VERIFIED``);
  a later child that receives the same bytes (same SHA-256) uses that folder
  without unpacking and checking again. Other bytes install as Flower does.
- :class:`WarmApp` (in the SuperExec, before it forks): once a task names a
  FAB hash whose folder holds that mark, import the ClientApp module from the
  folder; Flower's ``load_app`` reuses a module already in ``sys.modules``, so
  the children skip the import. A task of another FAB forgets those modules
  (in the child: :func:`cached_install`; in the SuperExec: the next
  :meth:`WarmApp.prepare`), so no message runs another FAB's code.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import tomllib

VERIFIED = ".warm-exec-verified"  # the full SHA-256 of the FAB installed in the folder


def installed_folder(fab_hash: str, home: Path | None = None) -> Path | None:
    """The folder a child installed the FAB ``fab_hash`` into, or None.

    Parameters
    ----------
    fab_hash : str
        The FAB's SHA-256, 64 hex digits.
    home : Path, optional
        Flower's home folder (default: ``$FLWR_HOME``, else ``~/.flwr``); apps
        are in its ``apps/`` folder, named ``...<first 8 hex digits>``.
    """
    from flwr.common.constant import APP_DIR, FAB_HASH_TRUNCATION
    from flwr.supercore.utils import get_flwr_home

    apps = (home or get_flwr_home()) / APP_DIR
    for folder in apps.glob(f"*.{fab_hash[:FAB_HASH_TRUNCATION]}"):
        try:
            if (folder / VERIFIED).read_text().strip() == fab_hash:
                return folder
        except OSError:
            continue
    return None


def _clientapp_module(folder: Path) -> str:
    """The module of the ClientApp that the FAB in ``folder`` names."""
    config = tomllib.loads((folder / "pyproject.toml").read_text())
    ref = config["tool"]["flwr"]["app"]["components"]["clientapp"]
    return str(ref).partition(":")[0]


class WarmApp:
    """The ClientApp module of one installed FAB, imported in this process.

    Attributes
    ----------
    fab_hash : str or None
        The FAB whose modules are imported (None: none).
    folder : Path or None
        Its installed folder.
    """

    def __init__(self) -> None:
        self.fab_hash: str | None = None
        self.folder: Path | None = None

    def prepare(self, fab_hash: str | None) -> bool:
        """Import the ClientApp of FAB ``fab_hash`` if a child installed it; True if done.

        A module of that name already imported from elsewhere is left alone
        (nothing is imported): the children then load the app as Flower does.
        """
        if not fab_hash or fab_hash == self.fab_hash:
            return fab_hash is not None and fab_hash == self.fab_hash
        folder = installed_folder(fab_hash)
        if folder is None:
            return False
        self.forget()
        try:
            name = _clientapp_module(folder)
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return False
        known = sys.modules.get(name)
        if known is not None and not _inside(getattr(known, "__file__", None), folder):
            return False
        sys.path.insert(0, str(folder))
        importlib.import_module(name)
        self.fab_hash, self.folder = fab_hash, folder
        return True

    def forget(self) -> None:
        """Drop the imported FAB's modules and its ``sys.path`` entry."""
        if self.folder is None:
            return
        for name, module in list(sys.modules.items()):
            if _inside(getattr(module, "__file__", None), self.folder):
                del sys.modules[name]
        while str(self.folder) in sys.path:
            sys.path.remove(str(self.folder))
        self.fab_hash, self.folder = None, None


def _inside(path: str | None, folder: Path) -> bool:
    return bool(path) and Path(path).resolve().is_relative_to(folder.resolve())


def cached_install(install: Callable[..., Path], warm: WarmApp) -> Callable[..., Path]:
    """Flower's ``install_from_fab`` that installs a FAB's bytes once.

    Parameters
    ----------
    install : callable
        Flower's ``flwr.cli.install.install_from_fab(fab_file, install_dir=None,
        skip_prompt=False) -> Path`` (unpacks, checks every file's SHA-256,
        installs; raises ``click.ClickException`` on a bad FAB).
    warm : WarmApp
        The modules this process inherited; forgotten when the bytes are
        another FAB's.

    Returns
    -------
    callable
        The same signature: bytes whose SHA-256 a child already installed return
        that folder; anything else goes to ``install``, and a successful install
        of bytes is marked for the next child.
    """

    def install_once(fab_file, install_dir=None, skip_prompt: bool = False) -> Path:
        if not isinstance(fab_file, bytes) or install_dir is not None:
            return install(fab_file, install_dir, skip_prompt=skip_prompt)
        digest = hashlib.sha256(fab_file).hexdigest()
        if warm.fab_hash is not None and warm.fab_hash != digest:
            warm.forget()
        folder = installed_folder(digest)
        if folder is not None:
            return folder
        path = Path(install(fab_file, install_dir, skip_prompt=skip_prompt))
        tmp = path / f"{VERIFIED}.{os.getpid()}.tmp"  # children may install at once
        try:
            tmp.write_text(digest)
            tmp.replace(path / VERIFIED)
        except OSError:  # e.g. a read-only app folder: the next child installs again
            tmp.unlink(missing_ok=True)
        return path

    return install_once

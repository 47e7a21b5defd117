"""cli.warm_app: a FAB unpacked and checked once, its ClientApp imported once."""

from __future__ import annotations

import hashlib
import sys

import pytest
from flwr.cli.build import build_fab_from_disk
from flwr.cli.install import install_from_fab

from cli.warm_app import VERIFIED, WarmApp, cached_install, installed_folder

PYPROJECT = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "warmtest"
version = "1.0.0"
dependencies = ["flwr"]

[tool.flwr.app]
publisher = "tester"

[tool.flwr.app.components]
serverapp = "warmtestpkg.server:app"
clientapp = "warmtestpkg.client:app"

[tool.flwr.app.config]
x = 1
"""


def _fab(folder, version: str) -> bytes:
    """A tiny Flower app whose ClientApp module holds ``version``."""
    (folder / "warmtestpkg").mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(PYPROJECT)
    (folder / "warmtestpkg" / "__init__.py").write_text("")
    (folder / "warmtestpkg" / "server.py").write_text("app = None\n")
    (folder / "warmtestpkg" / "client.py").write_text(f"app = {version!r}\n")
    return build_fab_from_disk(folder)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("warmtestpkg")]:
        del sys.modules[name]


def _counting():
    calls = []

    def install(fab, install_dir=None, skip_prompt=False):
        calls.append(hashlib.sha256(fab).hexdigest())
        return install_from_fab(fab, install_dir, skip_prompt=skip_prompt)

    return install, calls


def test_the_same_bytes_are_unpacked_and_checked_once(home):
    fab = _fab(home / "v1", "v1")
    install, calls = _counting()
    install_once = cached_install(install, WarmApp())
    first = install_once(fab, skip_prompt=True)
    assert install_once(fab, skip_prompt=True) == first and len(calls) == 1
    digest = hashlib.sha256(fab).hexdigest()
    assert (first / VERIFIED).read_text() == digest
    assert installed_folder(digest) == first
    other = _fab(home / "v2", "v2")  # other bytes: installed as Flower does
    assert install_once(other, skip_prompt=True) != first and len(calls) == 2


def test_a_wrong_mark_means_install_again(home):
    fab = _fab(home / "v1", "v1")
    install, calls = _counting()
    install_once = cached_install(install, WarmApp())
    folder = install_once(fab, skip_prompt=True)
    (folder / VERIFIED).write_text("0" * 64)  # damaged or another FAB's
    assert installed_folder(hashlib.sha256(fab).hexdigest()) is None
    install_once(fab, skip_prompt=True)
    assert len(calls) == 2


def test_the_clientapp_is_imported_once_and_forgotten_for_another_fab(home):
    warm = WarmApp()
    fab1, fab2 = _fab(home / "v1", "v1"), _fab(home / "v2", "v2")
    h1, h2 = (hashlib.sha256(f).hexdigest() for f in (fab1, fab2))
    assert not warm.prepare(h1)  # not installed yet: nothing to import
    install_once = cached_install(install_from_fab, warm)
    folder1 = install_once(fab1, skip_prompt=True)
    assert warm.prepare(h1) and warm.folder == folder1
    assert sys.modules["warmtestpkg.client"].app == "v1"
    install_once(fab2, skip_prompt=True)  # a child given another FAB drops v1
    assert "warmtestpkg.client" not in sys.modules and warm.fab_hash is None
    assert str(folder1) not in sys.path
    assert warm.prepare(h2) and sys.modules["warmtestpkg.client"].app == "v2"
    warm.forget()
    assert "warmtestpkg.client" not in sys.modules


def test_a_module_of_that_name_from_elsewhere_is_left_alone(home):
    fab = _fab(home / "v1", "v1")
    cached_install(install_from_fab, WarmApp())(fab, skip_prompt=True)
    sys.path.insert(0, str(home / "v1"))  # the same package name, not the FAB's
    try:
        import warmtestpkg.client  # noqa: F401
        warm = WarmApp()
        assert not warm.prepare(hashlib.sha256(fab).hexdigest())
        assert sys.modules["warmtestpkg.client"].__file__.startswith(str(home / "v1"))
    finally:
        sys.path.remove(str(home / "v1"))


def test_an_unwritable_app_folder_still_installs_every_time(home, monkeypatch):
    fab = _fab(home / "v1", "v1")
    install, calls = _counting()
    install_once = cached_install(install, WarmApp())
    real_write = type(home).write_text

    def refuse(path, *args, **kwargs):
        if VERIFIED in path.name:
            raise PermissionError(f"read-only: {path}")
        return real_write(path, *args, **kwargs)

    monkeypatch.setattr(type(home), "write_text", refuse)
    first = install_once(fab, skip_prompt=True)
    assert install_once(fab, skip_prompt=True) == first and len(calls) == 2
    assert not list(first.glob(f"{VERIFIED}*"))

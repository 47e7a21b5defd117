"""Issue 41, item 6: a user's module that one of this app's packages would shadow.

The app installs generic top-level packages (``task``, ``examples``, ...). A plug-in
spec whose top-level package resolves to ours while the user's folder has a module
or package of the same name is refused in one line naming both paths
(``task.registry.check_not_shadowed``), before any engine starts (the command's own
check: ``tests/test_cli.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from task.registry import (
    OURS,
    check_not_shadowed,
    get_task,
    import_object,
    shadowed,
    user_folders,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def mine(tmp_path):
    """A user's folder: the Flower template's ``task.py`` and an ``examples/digits.py``."""
    folder = tmp_path / "mine"
    (folder / "examples").mkdir(parents=True)
    (folder / "task.py").write_text("def make_task():\n    return None\n")
    (folder / "examples" / "digits.py").write_text("task = None\n")
    return folder


def test_our_packages_are_found_where_this_checkout_is():
    assert OURS == ROOT


@pytest.mark.parametrize("spec, ours, theirs", [
    ("task:make_task", "task", "task.py"),
    ("examples.digits:task", "examples", "examples"),
])
def test_a_users_module_shadowed_by_ours_is_refused_naming_both(mine, spec, ours,
                                                                theirs):
    assert shadowed(spec, [mine]) == (ROOT / ours, mine / theirs)
    with pytest.raises(ValueError) as err:
        check_not_shadowed(spec, "task", [mine])
    message = str(err.value)
    assert "\n" not in message and "'task'" in message and repr(spec) in message
    assert str(ROOT / ours) in message and str(mine / theirs) in message


def test_names_that_are_not_ours_or_not_the_users_pass(mine, tmp_path):
    assert shadowed("mytask:task", [mine]) is None  # not one of our packages
    assert shadowed("task:make_task", [tmp_path / "empty"]) is None  # nothing of theirs
    assert shadowed("examples.digits:task", [ROOT]) is None  # our own folder
    copy = tmp_path / "copy"  # another copy of this app (a checkout beside the FAB)
    (copy / "examples").mkdir(parents=True)
    (copy / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    assert shadowed("examples.digits:task", [copy]) is None


def test_the_users_folders_are_the_callers_the_cwd_and_pythonpath(mine, tmp_path,
                                                                 monkeypatch):
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("SE_CALLER_DIR", str(mine))
    entries = [str(other), str(tmp_path / "missing"), ""]  # absent and empty: skipped
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(entries))
    monkeypatch.chdir(tmp_path)
    assert user_folders() == [mine, tmp_path, other]


def test_a_users_spec_is_refused_and_a_builtin_is_not(mine, monkeypatch):
    """Through the resolver every plug-in takes (task=, frameworks=)."""
    monkeypatch.delenv("SE_CALLER_DIR", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(mine)
    with pytest.raises(ValueError, match="'task' = 'task:make_task'.* shadows your "):
        get_task("task:make_task")  # never resolved: get_task's cache cannot hold it
    with pytest.raises(ValueError, match="'task' = 'examples.digits:task'.* shadows"):
        import_object("examples.digits:task", "task")
    assert import_object("task.registry:get_task", "task", builtin=True) is get_task
    assert get_task("mnist").name == "mnist"  # a built-in name: its module is ours


def test_a_users_method_spec_is_refused(mine, monkeypatch):
    from server_app.config import ConfigError
    from server_app.unlearning.methods import load_method

    monkeypatch.chdir(mine)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    with pytest.raises(ConfigError, match="'frameworks' = 'task:Method'.* shadows"):
        load_method("task:Method")

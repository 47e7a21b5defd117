"""Nothing half done (#43): checks before writes, one-line failures, digests verified."""

from __future__ import annotations

import sys

import pytest

from server_app.config import ConfigError
from server_app.config.methods import proposed
from task.config import fused_run_config

BF16 = '''
import dataclasses
import mytask

def _bf16(num_classes):
    return mytask.task.model(num_classes).to(__import__("torch").bfloat16)

bf16 = dataclasses.replace(mytask.task, model=_bf16)
'''


@pytest.fixture
def plugins(tmp_path):
    from tests.test_plugins import page_file

    for name in ("mytask.py", "mymethod.py"):
        (tmp_path / name).write_text(page_file(name))
    (tmp_path / "bf16.py").write_text(BF16)
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in ("mytask", "mymethod", "bf16"):
        sys.modules.pop(name, None)


def _preflight_line(run: dict) -> str:
    from cli.simulation import preflight
    from tests.test_plugins import RUN

    with pytest.raises(ConfigError) as err:
        preflight(fused_run_config({**RUN, "mia": False, **run}))
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_a_bfloat16_model_is_refused_before_any_engine(plugins):
    line = _preflight_line({"task": "bf16:bf16", "frameworks": proposed()})
    assert "'task'" in line and "bfloat16" in line, line


def test_a_strategy_that_is_no_method_is_built_and_refused_before_any_engine(plugins):
    line = _preflight_line({"frameworks": f"{proposed()},strategies:ShardedStrategy"})
    assert "'frameworks'" in line and "strategies:ShardedStrategy" in line, line
    assert "cannot be built" in line, line


def test_the_documented_method_is_built_in_the_check(plugins):
    from cli.simulation import preflight
    from tests.test_plugins import RUN

    preflight(fused_run_config({**RUN, "mia": False}))  # mymethod:FineTune builds

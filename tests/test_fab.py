"""The FAB that `flwr run` and `cli deploy` ship: the apps' code, nothing more."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_fab_holds_the_apps_and_leaves_docs_tests_and_benchmarks_out():
    names = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(ROOT))).namelist()
    for module in ("server_app/app.py", "client_app/app.py", "task/train.py",
                   "history/store.py", "coding/lagrange.py", "strategies/factory.py",
                   "examples/resnet.py", "examples/digits.py",  # plug-ins run as shipped
                   "runstore/folder.py", "audits/run.py"):  # the ServerApp imports both
        assert module in names
    assert not [n for n in names if n.split("/")[0] in ("docs", "tests", "benchmarks")]

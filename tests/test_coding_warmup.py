"""The install step's kernel warm-up (``python -m coding.warmup``)."""

import subprocess
import sys
from pathlib import Path

import pytest

from coding.warmup import compile_kernels

ROOT = Path(__file__).resolve().parents[1]


def test_warmup_round_trips_every_dtype_and_reports_seconds():
    seconds = compile_kernels()  # its round trips assert the blocks come back
    assert 0 < seconds < 600


@pytest.mark.subprocess
def test_simulate_sh_warms_the_kernels_when_it_installs():
    script = (ROOT / "simulate.sh").read_text()
    start = script.index("pip install -q --no-cache-dir -e")
    end = script.index('touch "$VENV/.installed"')
    install = script[start:end]
    assert '-m coding.warmup' in install
    assert subprocess.run([sys.executable, "-m", "coding.warmup"], cwd=ROOT,
                          capture_output=True, text=True).returncode == 0

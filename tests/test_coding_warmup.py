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


@pytest.mark.subprocess
def test_a_copy_of_the_code_elsewhere_loads_the_kernels_from_the_cache(tmp_path):
    """Flower runs a copy of the app (the FAB) from a new folder: no compiling there."""
    import shutil

    compile_kernels()  # fills (or reads) the environment's cache
    shutil.copytree(ROOT / "coding", tmp_path / "coding",
                    ignore=shutil.ignore_patterns("__pycache__"))
    probe = ("import coding._kernels as k, coding.warmup as w; w.compile_kernels(); "
             "fns = [f for f in vars(k).values() if hasattr(f, 'stats')]; "
             "print(k.__file__, sum(sum(f.stats.cache_hits.values()) for f in fns), "
             "sum(sum(f.stats.cache_misses.values()) for f in fns))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    where, hits, misses = proc.stdout.split()
    assert where == str(tmp_path / "coding" / "_kernels.py")
    assert int(hits) > 0 and int(misses) == 0, proc.stdout

"""Compare two run folders of the same seeded config: summary numbers and model files.

``PYTHONPATH=. python docs/results/determinism/compare.py RUN_A RUN_B`` prints every value of
summary.json that differs (timings, paths and the run name left out) and whether
each models/*.npz is bit for bit the same; exit status 1 if anything differs.
"""

import hashlib
import json
import sys
from pathlib import Path

from history.files import read_arrays

SKIP = ("_s", "seconds", "wall", "time", "run-name", "results-dir", "received",
        "done_at", "data_dir", "entries")


def leaves(value, path=""):
    """(dotted path, value) of every leaf of a JSON value, skipping :data:`SKIP` keys."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not any(s in key for s in SKIP):
                yield from leaves(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")
    else:
        yield path, value


def arrays_digest(path: Path) -> str:
    """SHA-256 over the arrays of an .npz (names, dtypes, shapes, bytes)."""
    digest = hashlib.sha256()
    arrays = read_arrays(path)
    for name in sorted(arrays):
        array = arrays[name]
        digest.update(f"{name}/{array.dtype.str}/{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def main(a: str, b: str) -> int:
    """Print the differences between run folders ``a`` and ``b``; 1 if any."""
    sa, sb = (dict(leaves(json.loads((Path(r) / "summary.json").read_text())))
              for r in (a, b))
    differ = sorted(k for k in sa.keys() | sb.keys() if sa.get(k) != sb.get(k))
    for key in differ:
        print(f"differs: {key}: {sa.get(key)!r} vs {sb.get(key)!r}")
    print(f"summary.json: {len(sa)} values compared, {len(differ)} differ")
    same_models = True
    for path in sorted((Path(a) / "models").glob("*.npz")):
        other = Path(b) / "models" / path.name
        same = other.is_file() and arrays_digest(path) == arrays_digest(other)
        same_models &= same
        print(f"models/{path.name}: {'bit for bit the same' if same else 'DIFFERENT'}")
    return 0 if not differ and same_models else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))

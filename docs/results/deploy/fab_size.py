"""Size of the FAB that ``flwr run`` and ``cli deploy`` ship (docs/DEPLOY.md).

``.venv/bin/python docs/results/deploy/fab_size.py`` (from the project root) builds
it with Flower's own builder, as ``flwr run`` does, and prints bytes and files.
"""

import io
import zipfile
from pathlib import Path

from flwr.cli.build import build_fab_from_disk

if __name__ == "__main__":
    fab = build_fab_from_disk(Path(__file__).resolve().parents[3])
    files = zipfile.ZipFile(io.BytesIO(fab)).namelist()
    print(f"{len(fab)} bytes, {len(files)} files")

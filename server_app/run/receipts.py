"""Receipts: what was done for each request to be forgotten, one JSON file each.

A staged run writes ``<run folder>/receipts/<request id>.json`` when a request is
done or refused (:func:`write_receipt`); ``./simulate.sh receipts --run NAME``
lists them (:func:`list_receipts`). A receipt holds the request (id, clients,
where it came from), when it was received and done (UTC, ISO 8601), the stage,
the shards SE retrained and the rounds it replayed, the SHA-256 of the shard
models before and after (:func:`models_sha256`), the cost of each framework
(client-epochs, compute seconds, modelled wall seconds) and the accuracy before
and after.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from flwr.app import ArrayRecord

from history.files import atomic_write, readable_mode

RECEIPTS_DIR = "receipts"
REQUIRED = frozenset({"request_id", "clients", "status", "stage"})
"""Keys every receipt has (done or refused)."""


def models_sha256(models: Sequence[ArrayRecord]) -> str:
    """SHA-256 (hex) of shard models: shard, layer name, dtype, shape and bytes of each.

    Two sets of shard models have the same digest exactly when every array is
    bit for bit the same (with the same names, dtypes and shapes, in order).
    """
    digest = hashlib.sha256()
    for s, record in enumerate(models):
        for key, array in record.items():
            values = array.numpy()
            digest.update(f"{s}/{key}/{values.dtype.str}/{values.shape}".encode())
            digest.update(values.tobytes())
    return digest.hexdigest()


def shard_digests(models: Sequence[ArrayRecord]) -> dict:
    """``{"models": digest of all, "shards": [digest of each]}`` (:func:`models_sha256`).

    A shard that was not retrained keeps its digest, bit for bit.
    """
    return {"models": models_sha256(models),
            "shards": [models_sha256([record]) for record in models]}


def utc(seconds: float | None) -> str | None:
    """UNIX seconds -> ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (None stays None)."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_receipt(run_folder: Path, receipt: dict) -> Path:
    """Write ``receipt`` to ``<run_folder>/receipts/<receipt["request_id"]>.json``.

    Atomic (a crash leaves the old file or the new one); returns the path.
    """
    folder = Path(run_folder) / RECEIPTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{receipt['request_id']}.json"
    atomic_write(path, (json.dumps(receipt, indent=2, allow_nan=False) + "\n").encode(),
                 readable_mode())
    return path


def list_receipts(run_folder: Path) -> list[dict]:
    """Every receipt of the run, in request order (by id).

    Raises
    ------
    ValueError
        A receipt file that cannot be read, is not JSON, or is not a receipt
        (an object with :data:`REQUIRED` keys); one line, naming the file.
    """
    out = []
    for path in sorted((Path(run_folder) / RECEIPTS_DIR).glob("r*.json")):
        try:
            receipt = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"receipt {path} cannot be read: {err}") from None
        if not isinstance(receipt, dict) or not REQUIRED <= set(receipt):
            raise ValueError(f"receipt {path} is damaged: a JSON object with keys "
                             f"{', '.join(sorted(REQUIRED))} was expected")
        out.append(receipt)
    return out


def receipt_line(receipt: dict) -> str:
    """One line per receipt for the ``receipts`` command."""
    se = (receipt.get("cost") or {}).get("SE") or {}
    shards = receipt.get("shards_retrained")
    version = receipt.get("version") or {}
    when = (f"after the run v{version.get('before')}->v{version.get('after')}"
            if receipt.get("after_run") else f"stage {receipt.get('stage')}")
    return (f"{receipt['request_id']}  {receipt['status']:<8} {when}  clients "
            f"{receipt['clients']}  shards "
            f"{shards if shards is not None else '-'}  rounds replayed "
            f"{receipt.get('rounds_replayed', '-')}  SE {se.get('client_epochs', 0):.1f} "
            f"client-epochs  done {receipt.get('done_at') or '-'}{_digests(receipt)}")


def _digests(receipt: dict) -> str:
    """``  models sha256 <before> -> <after>`` where the receipt names both."""
    digests = receipt.get("models_sha256") or {}
    before, after = (digests.get(k) or {} for k in ("before", "after"))
    if not (before.get("models") and after.get("models")):
        return ""
    return f"  models sha256 {before['models']} -> {after['models']}"

"""Receipts: what was done for each request to be forgotten, one JSON file each.

A staged run writes ``<run folder>/receipts/<request id>.json`` when a request is
done or refused (:func:`write_receipt`); ``./simulate.sh receipts --run NAME``
lists them (:func:`list_receipts`). A receipt holds the request (id, clients,
where it came from), when it was received and done (UTC, ISO 8601), the stage,
the shards SE retrained and the rounds it replayed, the SHA-256 of the shard
models before and after (:func:`models_sha256`), the cost of each framework
(client-epochs, client rounds, compute, modelled wall and wall seconds;
:func:`receipt_cost`) and the accuracy before
and after. It also carries the evidence: ``erased``, what of the stored history
was erased for the request (the forgotten clients' stored updates, the shard
models they shaped, the coded slice parts re-coded without them; counts in
``erased.counts``, :func:`erasure_counts`), or, where nothing was, what is still
kept (:func:`kept_history`); and ``verification``, the audit's figures when it ran
(backdoor ASR, membership inference; :func:`verification_figures`).
``receipts --run NAME`` prints one line per receipt, and with ``--detail`` the
evidence under it (:mod:`cli.receipts`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from flwr.app import ArrayRecord

from history import HistoryStore
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


COST_KEYS = ("client_epochs", "client_rounds", "compute_s", "modelled_wall_s", "wall_s")
"""A receipt's ``cost.<framework>`` keys (:func:`receipt_cost`)."""


def receipt_cost(spent) -> dict:
    """A receipt's ``cost.<framework>``: what one framework spent on the request.

    Parameters
    ----------
    spent : CostMeter | RequestCost | FrameworkSummary
        Anything with ``client_epochs`` (float) and ``client_rounds`` (int:
        server rounds that asked a client to train), and either ``compute_s`` /
        ``wall_s`` (seconds) or their ``retrain_`` forms, and ``modelled_wall_s``.

    Returns
    -------
    dict
        :data:`COST_KEYS` -> value (``client_rounds`` None where not measured).
    """
    def get(key: str):
        value = getattr(spent, key, None)
        return getattr(spent, f"retrain_{key}", None) if value is None else value

    return {key: get(key) for key in COST_KEYS}


def utc(seconds: float | None) -> str | None:
    """UNIX seconds -> ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (None stays None)."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def erasure_counts(erased: dict) -> dict:
    """``erased.counts`` of a receipt: how many of each thing the erasure removed.

    Parameters
    ----------
    erased : dict
        What :meth:`history.HistoryStore.erase` (uncoded) or
        :func:`history.coded.erasure.erase_coded` (coded) returned.

    Returns
    -------
    dict
        ``updates`` (stored client updates erased) and, uncoded,
        ``shard_models`` (stored shard models deleted), ``files`` and ``bytes``
        freed; coded, ``rounds_recoded``, ``slice_parts_replaced`` (holders that
        replaced their part, summed over the re-coded rounds) and ``stale``
        (holders that did not: their old part is never read again).
    """
    counts = {"updates": len(erased.get("updates", []))}
    if erased.get("store") == "coded":
        counts.update(rounds_recoded=len(erased.get("rounds_recoded", [])),
                      slice_parts_replaced=sum(len(h) for h in
                                               erased.get("nodes", {}).values()),
                      stale=len(erased.get("stale", [])))
    else:
        counts.update(shard_models=len(erased.get("shard_models", [])),
                      files=len(erased.get("files", [])),
                      bytes=int(erased.get("bytes", 0)))
    return counts


def kept_history(store, clients: Sequence[int], why: str) -> dict:
    """``erased`` of a receipt whose request erased nothing: what is still kept.

    Parameters
    ----------
    store : history.TrainingHistory
        The history SE replayed from (``client_shard``, ``rounds``,
        ``participants``; coded: the catalog only, no slice is fetched).
    clients : Sequence[int]
        The request's partition ids.
    why : str
        Why nothing was erased (one sentence).

    Returns
    -------
    dict
        ``store`` ("uncoded" or "coded"), ``updates`` ([]), ``counts``
        (``updates``: 0), ``kept`` (``updates``: the learning rounds in which a
        client of the request took part in its shard, each a stored update that
        is still kept, or still coded into every holder's slice) and ``note``.
    """
    shard_of, gone = store.client_shard(), set(clients)
    kept = 0
    for shard in sorted({shard_of[p] for p in gone if p in shard_of}):
        for rnd in store.rounds(shard):
            kept += sum(pid in gone for pid, _ in store.participants(shard, rnd))
    kind = "uncoded" if isinstance(store, HistoryStore) else "coded"
    return {"store": kind, "updates": [], "counts": {"updates": 0},
            "kept": {"updates": kept}, "note": why}


MODEL_KEYS = ("backdoor_asr", "backdoor_asr_ensemble", "mia_auc", "mia_f1",
              "mia_tpr_at_1fpr", "mia_lira_auc", "mia_lira_tpr_at_01fpr",
              "mia_lira_client_auc")
"""The per-model verification figures a receipt copies from summary.json."""


def verification_figures(models: dict[str, dict], verification: dict | None
                         ) -> dict | None:
    """``verification`` of a receipt: the audit's figures, None when it did not run.

    Parameters
    ----------
    models : dict
        ``{"original": scores, "<framework>": scores}``, each a summary.json
        block (``ModelScores.to_json``, ``FrameworkSummary.to_json``).
    verification : dict or None
        summary.json ``verification`` (the backdoor settings, the forgotten
        clients' learning rounds, the attack's settings).

    Returns
    -------
    dict or None
        ``{figure: {model: value}}`` for each of :data:`MODEL_KEYS` some model
        has (ASR in [0, 1]; MIA AUC, F1, TPR at 1% FPR; offline LiRA's AUC and
        TPR at 0.1% FPR per example, AUC per client), plus ``backdoor``
        (settings) and ``forgotten_rounds`` where known; None without figures.
    """
    out: dict = {}
    for key in MODEL_KEYS:
        values = {name: scores[key] for name, scores in models.items()
                  if scores.get(key) is not None}
        if values:
            out[key] = values
    if not out:
        return None
    for key in ("backdoor", "forgotten_rounds"):
        if (verification or {}).get(key) is not None:
            out[key] = verification[key]
    return out


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


def list_receipts(run_folder: Path, kept: Sequence[dict] = ()) -> list[dict]:
    """Every receipt of the run, in request order (by id).

    ``kept``: the receipts the run's catalog keeps
    (:meth:`runstore.inbox.RequestInbox.receipts`), the record: each is
    listed whether or not its file is there (:func:`missing_files` says which
    is not). A file whose request the catalog keeps no receipt for (a run from
    before the catalog kept them) is listed from the file.

    Raises
    ------
    ValueError
        A receipt file that cannot be read, is not JSON, or is not a receipt
        (an object with :data:`REQUIRED` keys); one line, naming the file.
    """
    out = {r["request_id"]: r for r in kept}
    for path in sorted((Path(run_folder) / RECEIPTS_DIR).glob("r*.json")):
        try:
            receipt = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"receipt {path} cannot be read: {err}") from None
        if not isinstance(receipt, dict) or not REQUIRED <= set(receipt):
            raise ValueError(f"receipt {path} is damaged: a JSON object with keys "
                             f"{', '.join(sorted(REQUIRED))} was expected")
        out.setdefault(receipt["request_id"], receipt)
    return [out[rid] for rid in sorted(out)]


def missing_files(run_folder: Path, kept: Sequence[dict]) -> dict[str, OSError]:
    """Write the file of each receipt in ``kept`` that has none; return those it could not.

    Returns
    -------
    dict[str, OSError]
        Request id -> why its file is still missing.
    """
    missing = {}
    for receipt in kept:
        path = Path(run_folder) / RECEIPTS_DIR / f"{receipt['request_id']}.json"
        if path.is_file():
            continue
        try:
            write_receipt(run_folder, receipt)
        except OSError as err:
            missing[receipt["request_id"]] = err
    return missing


def differing_files(run_folder: Path, kept: Sequence[dict]) -> list[str]:
    """Request ids whose receipt file holds another receipt than the catalog's copy.

    A file that is not there is :func:`missing_files`' matter; one that does not
    read is :func:`list_receipts`'.
    """
    out = []
    for receipt in kept:
        path = Path(run_folder) / RECEIPTS_DIR / f"{receipt['request_id']}.json"
        try:
            if path.is_file() and json.loads(path.read_text()) != receipt:
                out.append(receipt["request_id"])
        except (OSError, ValueError):
            out.append(receipt["request_id"])
    return out

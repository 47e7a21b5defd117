"""How the ``receipts`` command prints a receipt (:mod:`runstore.receipts` keeps them).

One line per receipt (:func:`receipt_line`) and, with ``--detail``, the evidence
under it (:func:`receipt_detail`), in the words of the method the app exists for
(:func:`server_app.config.methods.proposed`).
"""

from __future__ import annotations

from runstore.receipts import MODEL_KEYS, erasure_counts
from server_app.config.methods import proposed


def receipt_line(receipt: dict) -> str:
    """One line per receipt for the ``receipts`` command.

    The request, its state, when, the clients, shards and rounds replayed, SE's
    client-epochs, when it was done, then (when the receipt has them) the
    updates erased (or kept) and the headline verification figure, and the
    models' SHA-256 before and after; a failed request's reason (a refused
    one's is in its receipt).
    """
    name = proposed()
    se = (receipt.get("cost") or {}).get(name) or {}
    shards = receipt.get("shards_retrained")
    version = receipt.get("version") or {}
    when = (f"after the run v{version.get('before')}->v{version.get('after')}"
            if receipt.get("after_run") else f"stage {receipt.get('stage')}")
    kind = "records" if (receipt.get("erasure") or {}).get("records") else "class"
    who = (f"{kind}: {receipt['erasure_note']}" if receipt.get("erasure_note")
           else f"clients {receipt['clients']}")
    work = (f"  shards {shards if shards is not None else '-'}  rounds replayed "
            f"{receipt.get('rounds_replayed', '-')}  {name} "
            f"{se.get('client_epochs', 0):.1f} client-epochs"
            if receipt["status"] == "done" else "")  # a refused one did no work
    if receipt.get("honoured_by"):  # done by the request that forgot its clients
        work = f"  {receipt['honoured_by']['note']}"
    return (f"{receipt['request_id']}  {receipt['status']:<8} {when}  {who}{work}  done "
            f"{receipt.get('done_at') or '-'}{_evidence(receipt)}"
            f"{_digests(receipt)}"
            + (f"  reason: {receipt.get('reason')}" if receipt['status'] == "failed"
               else ""))


def _evidence(receipt: dict) -> str:
    """``  erased 12 updates`` (or ``kept``) and ``  backdoor ASR 0.98 -> SE 0.01``."""
    out = ""
    erased = receipt.get("erased")
    if erased:
        counts = erased.get("counts") or erasure_counts(erased)
        n = counts["updates"]
        out = f"  erased {n} update{'' if n == 1 else 's'}"
        if erased.get("kept"):
            out += f" (kept {erased['kept']['updates']})"
    figures, name = receipt.get("verification") or {}, proposed()
    for key, label in (("backdoor_asr", "backdoor ASR"), ("mia_auc", "MIA AUC")):
        values = figures.get(key) or {}
        if "original" in values and name in values:
            out += f"  {label} {values['original']:.3f} -> {name} {values[name]:.3f}"
    return out


def receipt_detail(receipt: dict) -> list[str]:
    """The evidence of one receipt, one indented line each (``receipts --detail``).

    Returns
    -------
    list[str]
        The models' SHA-256 before and after (all shards, and each shard), what
        was erased (counts, the updates as ``s<shard>r<round>c<client>``, the
        files or the holders) or kept, and every verification figure by model.
    """
    out = []
    digests = receipt.get("models_sha256") or {}
    for when in ("before", "after"):
        block = digests.get(when) or {}
        if block.get("models"):
            out.append(f"    models sha256 {when}: {block['models']}  shards "
                       + " ".join(block.get("shards", [])))
    engine = receipt.get("engine")
    if engine:  # where the request was carried out, and who trained
        out.append(f"    engine: {engine.get('kind')}"
                   + (f" (federation {engine['federation']})" if engine.get("federation")
                      else "")
                   + (f"; trained: partitions {engine['trained']}"
                      if engine.get("trained") is not None else ""))
    erased = receipt.get("erased")
    if erased:
        counts = erased.get("counts") or erasure_counts(erased)
        out.append(f"    erased ({erased.get('store')}): "
                   + ", ".join(f"{k} {v}" for k, v in counts.items()))
        if erased.get("updates"):
            out.append("      updates " + " ".join(f"s{s}r{g}c{c}"
                                                   for s, g, c in erased["updates"]))
        if erased.get("files"):
            out.append("      files " + " ".join(erased["files"]))
        for rnd, holders in (erased.get("nodes") or {}).items():
            out.append(f"      {rnd} parts replaced by clients {holders}")
        if erased.get("kept"):
            out.append(f"      kept {erased['kept']['updates']} stored updates: "
                       f"{erased.get('note', '')}")
    for key, values in (receipt.get("verification") or {}).items():
        if key in MODEL_KEYS:
            out.append(f"    {key}: " + ", ".join(f"{m} {v:.4f}" for m, v in
                                                  values.items()))
    return out


def _digests(receipt: dict) -> str:
    """``  models sha256 <before> -> <after>`` where the receipt names both."""
    digests = receipt.get("models_sha256") or {}
    before, after = (digests.get(k) or {} for k in ("before", "after"))
    if not (before.get("models") and after.get("models")):
        return ""
    return f"  models sha256 {before['models']} -> {after['models']}"

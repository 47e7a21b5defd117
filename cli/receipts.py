"""``receipts``: what was done for a run's requests (:mod:`runstore.receipts` keeps them).

``receipts --run NAME`` lists the receipts and the requests still waiting: one
line per receipt (:func:`receipt_line`) and, with ``--detail``, the evidence under
it (:func:`receipt_detail`) with its digests recomputed from the stored model
versions; ``--json``: the receipts as JSON. In the words of the method the app
exists for (:func:`server_app.config.methods.proposed`). Exit status 1 when a
digest or a receipt file does not verify (as ``models``), else 0.
"""

from __future__ import annotations

import json
from pathlib import Path

from cli.runs import SUMMARY, open_inbox, run_folder
from cli.terminal import Parser
from runstore.folder import ModelsFileError
from runstore.receipts import (
    MODEL_KEYS,
    differing_files,
    erasure_counts,
    list_receipts,
    missing_files,
)
from runstore.versions import verify_version
from server_app.admission import asked
from server_app.config import ConfigError
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
        earlier = set(erased.get("earlier_clients") or ())
        if earlier:
            theirs = sum(c in earlier for _, _, c in erased.get("updates", []))
            out += f" ({theirs} of clients forgotten before: {sorted(earlier)})"
        if erased.get("kept"):
            out += f" (kept {erased['kept']['updates']})"
        baseline = receipt.get("erased_baseline")
        if baseline:  # the baselines' history holds the clients' updates too
            m = (baseline.get("counts") or erasure_counts(baseline))["updates"]
            out += f" + {m} in the baselines' history"
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
    for label, erased in (("erased", receipt.get("erased")),
                          ("erased from the baselines' history",
                           receipt.get("erased_baseline"))):
        out += _erased_lines(label, erased) if erased else []
    for key, values in (receipt.get("verification") or {}).items():
        if key in MODEL_KEYS:
            out.append(f"    {key}: " + ", ".join(f"{m} {v:.4f}" for m, v in
                                                  values.items()))
    return out


def _erased_lines(label: str, erased: dict) -> list[str]:
    """What an erasure removed from one store (counts, updates, files) or kept."""
    counts = erased.get("counts") or erasure_counts(erased)
    out = [f"    {label} ({erased.get('store')}): "
           + ", ".join(f"{k} {v}" for k, v in counts.items())]
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
    if erased.get("kept_models"):
        out.append("      kept shard models " + " ".join(
            f"s{s}r{g}" for s, g in erased["kept_models"]) + " (learned: model "
            "version 1 holds them too; the next request erases them)")
    return out


def _digests(receipt: dict) -> str:
    """``  models sha256 <before> -> <after>`` where the receipt names both."""
    digests = receipt.get("models_sha256") or {}
    before, after = (digests.get(k) or {} for k in ("before", "after"))
    if not (before.get("models") and after.get("models")):
        return ""
    return f"  models sha256 {before['models']} -> {after['models']}"


def _verify_receipt(folder: Path, receipt: dict, versions: dict,
                    checked: dict) -> str:
    """``digests verified`` or the mismatch: the receipt's digests recomputed.

    Each model version the receipt names must be recorded with the receipt's
    models digest (and file digest), and its file's arrays must still hash to
    it (:func:`runstore.versions.verify_version`, once per version).
    """
    named = receipt.get("version") or {}
    digests = receipt.get("models_sha256") or {}
    problems = []
    for when in ("before", "after"):
        number, want = named.get(when), (digests.get(when) or {}).get("models")
        if number is None or not want:
            continue
        version = versions.get(number)
        if version is None:
            problems.append(f"v{number} ({when}) is not recorded")
            continue
        if version.digests.get("models") != want:
            problems.append(f"models sha256 {when} is not v{number}'s recorded one")
        if number not in checked:
            try:
                verify_version(folder, version)
                checked[number] = None
            except ModelsFileError as err:
                checked[number] = str(err).split(";")[0]
        if checked[number]:
            problems.append(checked[number])
    file_digest = named.get("after_file_sha256")
    after = versions.get(named.get("after"))
    if file_digest and after is not None and after.file_sha256 != file_digest:
        problems.append(f"after_file_sha256 is not v{after.version}'s recorded file")
    if not (digests.get("before") or digests.get("after")):
        return "digests: none in this receipt"
    return "NOT VERIFIED: " + "; ".join(problems) if problems else \
        "digests verified (recomputed from the stored model versions)"


def main_receipts(argv: list[str], prog: str) -> int:
    """The ``receipts`` command: one line per receipt, then requests still waiting.

    Exit status 1 when ``--detail`` finds a digest that does not verify (as
    ``models``), else 0.
    """
    parser = Parser(prog=prog, description="List a run's receipts "
                    "(requests of a staged run, requests to a "
                    "finished run) and its waiting requests.")
    parser.add_run_options()
    parser.add_argument("--detail", action="store_true", help="under each receipt its "
                        "evidence: digests, what was erased or kept, the audit's figures")
    parser.add_argument("--json", action="store_true", help="print the receipts as one "
                        "JSON list and nothing else")
    args = parser.parse_args(argv)
    folder = run_folder(args.run, args.results_dir)
    with open_inbox(folder) as inbox:  # the catalog's receipts are the record
        kept = inbox.receipts()
        waiting = [r for r in inbox.all() if r.state in ("pending", "claimed")]
        versions = {v.version: v for v in inbox.versions()}
    try:
        receipts = list_receipts(folder, kept)
    except ValueError as err:  # a damaged receipt file: one line naming it
        raise ConfigError(str(err)) from None
    missing = missing_files(folder, kept)  # written again where it can be
    edited = differing_files(folder, kept)  # the catalog's copy is shown, not the file
    if args.json:
        print(json.dumps(receipts, indent=2))
        return 0
    checked: dict[int, str | None] = {}
    mismatch = False
    for receipt in receipts:
        print(receipt_line(receipt))
        if receipt["request_id"] in missing:
            print(f"    its file is missing ({missing[receipt['request_id']]}); the "
                  f"receipt is kept in {folder / 'run.sqlite'}")
        if receipt["request_id"] in edited:
            mismatch = True
            print(f"    NOT VERIFIED: its file {folder / 'receipts'}/"
                  f"{receipt['request_id']}.json differs from the receipt kept in "
                  f"{folder / 'run.sqlite'} (shown here); restore the file")
        if args.detail:
            verdict = _verify_receipt(folder, receipt, versions, checked)
            mismatch |= verdict.startswith("NOT VERIFIED")
            print("\n".join([*receipt_detail(receipt), "    " + verdict]))
    late = (f"recorded; `forget --run {args.run} --pending` carries it out" if (
        folder / SUMMARY).exists() else "not done yet: at the next stage boundary")
    for request in waiting:
        who = (asked(request).describe() if request.erasure
               else f"clients {request.clients}")
        print(f"{request.id}  {request.state:<8} stage {request.stage or '-'}  {who}  "
              f"({late})")
    if not receipts and not waiting:
        print(f"run {args.run}: no request yet")
    print(f"receipts: {folder / 'receipts'}")
    return 1 if mismatch else 0  # as `models`: a digest that does not verify

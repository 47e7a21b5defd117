"""Erasing forgotten clients' stored updates, and the shard models they shaped.

Once a request is carried out, no replay reads its clients' stored updates again
(their shards start from a stored model older than their first round), so they
are erased: from SE's history (uncoded: the blobs; coded: every round they took
part in is coded again without them on every holder) and from the baselines'
history (FedEraser's and FedRecover's, never coded). A later request erases them
right after its replay (:mod:`server_app.stages.later`); a one-stage run's planned
requests once its frameworks, audit and storage report no longer read the
stores (:mod:`server_app.stages.planned_receipt`). The plan of each uncoded
erasure is kept in the run catalog before anything is deleted, so an erasure
killed half-way and redone reports everything it erased.
"""

from __future__ import annotations

from collections.abc import Iterable

from history import HistoryStore
from history.coded.erasure import erase_coded
from runstore.inbox import Request
from runstore.receipts import erasure_counts, kept_history
from server_app.stages.state import RunState

__all__ = ["KEPT_CODED", "erase_stored"]

KEPT_CODED = ("a records request to a coded run erases no slice yet (not built): "
              "its owners' coded updates are kept, and no replay reads them (the "
              "owners train afresh without the erased records in every replay)")
"""Why a coded run's records receipt ``erased`` lists nothing (and what it keeps)."""


def erase_stored(run: RunState, request: Request, clients: list[int], shaped: set[int],
                 records: bool = False, earlier: Iterable[int] = (),
                 keep_round: int | None = None) -> dict:
    """Erase ``clients``' stored updates and the shard models they shaped.

    Parameters
    ----------
    run : RunState
        The run after ``request``'s replay (its store, catalog and folder).
    request : Request
        The request carried out (its id keys the plans in the run catalog).
    clients : list of int
        Partition ids whose updates go: the forgotten clients, or a records
        request's owners (every update of theirs saw the erased records).
    shaped : set of int
        Every client whose updates are gone so far, ``clients`` among them; in
        the shards of ``clients``, the stored models from the first round one
        of them trained are dropped (uncoded).
    records : bool
        A records or class request: ``clients`` stay in the run; a coded run
        keeps their updates (:data:`KEPT_CODED`).
    earlier : iterable of int
        Clients forgotten before ``request`` (in ``shaped``): what either store
        still keeps of theirs is erased too (a stage boundary keeps it, as did a
        planned request before this rule; an update erased already is skipped).
    keep_round : int, optional
        Uncoded stores keep their models of this round
        (:meth:`history.HistoryStore.erasure_plan`).

    Returns
    -------
    dict
        The receipt's ``erased`` (:meth:`history.HistoryStore.erase` or
        :func:`history.coded.erasure.erase_coded`, with ``counts``:
        :func:`runstore.receipts.erasure_counts`; ``earlier_clients``: the
        ``earlier`` clients, whose updates it lists too) and, when the run kept
        a baselines' history, ``erased_baseline`` likewise.

    Raises
    ------
    history.StoreError
        The baselines' store does not read back.
    """
    earlier = set(earlier) - set(clients)
    gone, shaped = sorted(set(clients) | earlier), set(shaped) | earlier
    if isinstance(run.store, HistoryStore):
        erased = _erase_uncoded(run, run.store, f"erase:{request.id}", gone, shaped,
                                keep_round)
    elif records:  # the owners' coded updates stay; earlier clients' go
        erased = {**kept_history(run.store, clients, KEPT_CODED),
                  **(erase_coded(run.store, sorted(earlier)) if earlier else {})}
        erased["counts"] = erasure_counts(erased)
    else:
        erased = erase_coded(run.store, gone)
        erased = {**erased, "counts": erasure_counts(erased)}
    if earlier:  # whose updates these are besides the request's own
        erased["earlier_clients"] = sorted(earlier)
    out = {"erased": erased}
    root = run.ctx.folder.history_dir("baseline")
    if root.exists():
        store = HistoryStore.open(root)
        try:
            out["erased_baseline"] = _erase_uncoded(
                run, store, f"erase-baseline:{request.id}", gone, shaped, keep_round)
        finally:
            store.close()
    return out


def _erase_uncoded(run: RunState, store: HistoryStore, key: str, clients: list[int],
                   shaped: set[int], keep_round: int | None = None) -> dict:
    """:meth:`HistoryStore.erase` of ``clients``, its plan kept under ``key`` first."""
    catalog = run.ctx.catalog
    plan = catalog.in_progress(key)
    if not isinstance(plan, dict):  # the first attempt: plan, keep, then delete
        plan = store.erasure_plan(sorted(shaped), sorted(clients), keep_round)
        catalog.progress(key, plan)
    erased = store.erase(sorted(shaped), sorted(clients), plan)
    return {**erased, "counts": erasure_counts(erased)}

"""Record identities inside a client's partition, and erasing records before training.

A record is one training example a client holds. Its id is its position in the
client's partition as the ClientApp loads it (:func:`task.data.client_data` for
the run's task, dataset, partition scheme, number of clients and seed): the split is
seeded, so the same settings give every client the same records in the same order
on every load, and an id names one example for the whole run without the server
ever seeing the data. A client with its own data folder (node-config
``client-data``, :mod:`task.client_folder`) numbers its records by their rows in
that folder, which the ``client-data`` command writes in the partition's order.
A records request names ids of one or more clients
(run-config ``forget-records``); a class-level request names labels
(``forget-labels``): every record of that label on every client.

The server sends a client its erased ids and the erased labels with every training
message (``erased-records`` and ``erased-labels`` in the message's config record);
:func:`keep_mask` is what the ClientApp drops before it trains.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

RECORDS_KEY = "erased-records"
"""Message config key: this client's erased record ids (list of int)."""
LABELS_KEY = "erased-labels"
"""Message config key: the erased labels (list of int), on every client."""
EXAMPLE = "'17:3,18,40-52; 21:0-9'"
"""A ``forget-records`` value, for error messages."""
MAX_ID = 999_999
"""The largest record id or label a request may name: more than any built-in
dataset holds (a range is checked against it before it is expanded, so a huge
range is a one-line error, not a process that runs out of memory)."""


def parse_ids(text: str) -> list[int]:
    """``"3,18,40-52"`` -> the sorted distinct ids (ranges inclusive).

    Raises
    ------
    ValueError
        A token that is not ``N`` or ``N-M`` with ``N <= M`` (both in 0..
        :data:`MAX_ID`), or no id.
    """
    ids: set[int] = set()
    for token in (t.strip() for t in text.split(",")):
        low, _, high = token.partition("-")
        if not (low.isascii() and low.isdigit()) or (
                high and not (high.isascii() and high.isdigit())):
            raise ValueError(f"{token!r} is not an id N or a range N-M")
        first, last = int(low), int(high or low)
        if last < first:
            raise ValueError(f"range {token!r} runs backwards")
        if last > MAX_ID:
            raise ValueError(f"{token[:40]!r} goes past {MAX_ID:,}, the largest id allowed")
        ids.update(range(first, last + 1))
    if not ids:
        raise ValueError("no id")
    return sorted(ids)


def parse_records(spec: str) -> dict[int, list[int]]:
    """``forget-records``: ``"17:3,18,40-52; 21:0-9"`` -> {client: sorted ids}.

    Clients are partition ids, each named once; ``""`` -> ``{}``.

    Raises
    ------
    ValueError
        One line naming the part that is wrong and the form allowed.
    """
    out: dict[int, list[int]] = {}
    if spec.strip() and not spec.replace(";", "").strip():
        raise ValueError(f"{spec!r} names no CLIENT:IDS (e.g. {EXAMPLE})")
    for part in (p.strip() for p in spec.split(";") if p.strip()):
        client, colon, ids = part.partition(":")
        client = client.strip()
        if not colon or not (client.isascii() and client.isdigit()):
            raise ValueError(f"{part!r} is not CLIENT:IDS (e.g. {EXAMPLE})")
        if int(client) in out:
            raise ValueError(f"client {client} is named twice")
        try:
            out[int(client)] = parse_ids(ids)
        except ValueError as err:
            raise ValueError(f"client {client}: {err} (e.g. {EXAMPLE})") from None
    return out


def parse_labels(spec: str) -> list[int]:
    """``forget-labels``: ``"3,7"`` -> [3, 7]; ``""`` -> []."""
    return parse_ids(spec) if spec.strip() else []


def keep_mask(num_records: int, labels: np.ndarray, erased_ids: Iterable[int] = (),
              erased_labels: Iterable[int] = ()) -> np.ndarray:
    """Boolean mask over a client's records: True for those it keeps.

    Parameters
    ----------
    num_records : int
        Records the client holds (its partition's length).
    labels : numpy.ndarray, shape (num_records,) or (num_records, ...)
        Their labels (only read when ``erased_labels`` is not empty; a text
        task's targets are not labels and take no label erasure).
    erased_ids : Iterable[int]
        Record ids (positions) to drop; ids past the end are an error.
    erased_labels : Iterable[int]
        Labels whose every record is dropped.

    Raises
    ------
    ValueError
        An id outside ``0 .. num_records - 1``.
    """
    keep = np.ones(num_records, dtype=bool)
    ids = np.fromiter(erased_ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= num_records):
        raise ValueError(f"erased record ids must be in 0..{num_records - 1}: got "
                         f"{sorted(set(ids[(ids < 0) | (ids >= num_records)].tolist()))}")
    keep[ids] = False
    drop = list(erased_labels)
    if drop:
        keep &= ~np.isin(np.asarray(labels).reshape(num_records, -1)[:, 0], drop)
    return keep


def check_against_sizes(records: Mapping[int, Iterable[int]],
                        sizes: Mapping[int, int]) -> str | None:
    """Why ``records`` cannot be erased from partitions of ``sizes`` (None: they can).

    ``sizes``: partition id -> records it holds.
    """
    for client, ids in sorted(records.items()):
        held = sizes.get(client)
        ids = list(ids)
        if held is None:
            return f"client {client} holds no partition"
        if max(ids) >= held:
            return (f"client {client} holds {held} records (ids 0..{held - 1}); "
                    f"{max(ids)} is not one")
        if len(set(ids)) >= held:
            return (f"client {client} would keep no record ({held} held); forget the "
                    "client instead (forget-clients)")
    return None

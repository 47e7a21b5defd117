"""Whether a run can take a request to forget: the rules its callers share.

One place decides whether a request is refused, wherever it comes from: the run
config's planned request (before any engine, :mod:`server_app.preflight`), the
``forget`` command before it records a request (:mod:`cli.forget`), and the
ServerApp when it takes one (a stage boundary, a finished run;
:mod:`server_app.stages`). The command line reads these rules without importing
the ServerApp's stages.

- A client request (:func:`later_refusal`): any client that ever took part can be
  forgotten, one that left included, unless its removal would leave a shard of
  the last stage without a client, in SE's shards or FR's (:func:`run_shards`,
  over the shards' lineages of a staged run, :func:`lineage_shards`).
- A records or class request (:func:`erasure_refusal`): it erases records of
  clients that stay (:mod:`server_app.unlearning.erasure`), checked against what
  each client holds (:class:`Holdings`) and the erasures in force
  (:func:`in_force_of`: the run's planned one and every records request done
  since, less the records of clients forgotten since).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache

import numpy as np

from runstore.inbox import Request
from server_app.config import ConfigError, RunConfig
from server_app.config.methods import reference
from server_app.rounds.federation import assign_shards
from server_app.unlearning.erasure import Erasure, planned_erasure
from task.records import check_against_sizes, keep_mask


def lineage_shards(num_clients: int, initial: int, num_shards: int, seed: int
                   ) -> list[list[int]]:
    """Shards over every client that ever exists (partition ids ascending).

    Clients ``0 .. initial - 1`` are split by :func:`assign_shards`; a later
    client p joins shard ``p mod num_shards``.

    Raises
    ------
    ValueError
        ``num_shards`` not in [1, initial].
    """
    shards = assign_shards(initial, num_shards, seed)
    for p in range(initial, num_clients):
        shards[p % num_shards].append(p)
    return shards


def present_shards(shards: Sequence[Sequence[int]], present: Iterable[int]
                   ) -> list[list[int]]:
    """Each shard's clients that are in ``present`` (order kept)."""
    here = set(present)
    return [[p for p in pids if p in here] for pids in shards]


def run_shards(cfg: RunConfig) -> list[tuple[list[list[int]], str]]:
    """The shards a request to a finished run must leave a client in.

    SE's (``num-shards``) and, when ``frameworks`` has FR, FR's
    (``baseline-shards``), as the ServerApp builds them: lineages for a staged
    run (:func:`lineage_shards`), else :func:`assign_shards` over every client.

    Returns
    -------
    list of (shards, what)
        Each federation's shards (partition ids) and its name in a refusal
        (``shard``, ``FR shard``).
    """
    feds = [(split_shards(cfg, cfg.training.num_shards), "shard")]
    if reference() in cfg.unlearning.framework_list:
        feds.append((split_shards(cfg, cfg.unlearning.baseline_shards),
                     f"{reference()} shard"))
    return feds


def split_shards(cfg: RunConfig, num_shards: int) -> list[list[int]]:
    """The run's clients in ``num_shards`` shards (partition ids), as the ServerApp does.

    Lineages for a staged run (:func:`lineage_shards`), else
    :func:`assign_shards` over every client; both seeded by ``seed``.
    """
    if cfg.stages.staged:
        return lineage_shards(cfg.data.num_clients, cfg.initial_clients, num_shards,
                              cfg.seed)
    return assign_shards(cfg.data.num_clients, num_shards, cfg.seed)


def later_refusal(clients: Sequence[int], joined: int, forgotten: Iterable[int],
                  present: Iterable[int],
                  feds: Sequence[tuple[Sequence[Sequence[int]], str]]) -> str | None:
    """Why a finished run cannot forget ``clients`` (None: it can).

    Any client that ever took part can be forgotten, one that left included;
    one whose removal would leave a shard of the last stage without a client
    cannot. The ServerApp refuses such a request in its receipt; ``forget``
    refuses it before recording it.

    Parameters
    ----------
    clients : Sequence[int]
        The request's partition ids.
    joined : int
        Clients that ever joined the run (ids ``0 .. joined - 1``).
    forgotten : Iterable[int]
        Every client forgotten so far.
    present : Iterable[int]
        The last stage's clients.
    feds : Sequence of (shards, what)
        Each federation's shards and its name (:func:`run_shards`).

    Returns
    -------
    str or None
        The reason, in one line, or None.
    """
    unknown = [p for p in clients if p >= joined]
    if unknown:
        return f"client(s) {unknown} are not clients of this run"
    done_before = set(forgotten)
    done = [p for p in clients if p in done_before]
    if done:
        return f"client(s) {done} are already forgotten"
    gone = done_before | set(clients)
    present = list(present)
    for shards, what in feds:
        here = present_shards(shards, (p for p in present if p not in gone))
        empty = [s for s, pids in enumerate(here) if not pids]
        if empty:
            return f"{what}(s) {empty} would keep no client"
    return None


Refusal = tuple[str, str]
"""``(what, reason)``: ``what`` is ``"records"`` or ``"labels"`` (the option or
run-config key to name), ``reason`` one line."""


@dataclass(frozen=True)
class Holdings:
    """What each client of a run holds: the facts an erasure is checked against.

    Attributes
    ----------
    spec : str
        The run's task (``task`` / ``dataset``), for messages.
    sizes : Mapping[int, int]
        Partition id -> training records it holds (``client-samples`` applied).
    load : Callable[[], tuple]
        ``() -> (TaskData, rows)``: the task's data and each client's training
        rows (a list of int arrays, partition-id order). Called only for a class
        request (labels), so a records request needs the sizes alone.
    own_data : bool
        Run-config ``client-data = true``: every client reads its own folder,
        ``sizes`` are the counts the nodes reported at discovery, and the server
        holds no label: a class request is refused (:func:`erasure_refusal`).
    """

    spec: str
    sizes: Mapping[int, int]
    load: Callable[[], tuple]
    own_data: bool = False

    @classmethod
    def of_run(cls, cfg: RunConfig, data_dir: str,
               sizes: Mapping[int, int] | None = None) -> Holdings:
        """A run's holdings from its settings and data folder (the data loaded once).

        With ``client-data = true`` the server holds no client's rows: ``sizes``
        (the counts the nodes reported) are required, and nothing is loaded.

        Raises
        ------
        ConfigError
            The data cannot be loaded (one line naming ``task``), or
            ``client-data = true`` without ``sizes`` (the run has not reported
            its clients' counts yet).
        """
        if cfg.data.client_data:
            if sizes is None:
                raise ConfigError(
                    "run-config 'client-data' = True: the run has no record counts "
                    "of its clients yet (they are reported at discovery); a records "
                    "request is checked once its nodes have answered")
            return cls(cfg.data.task_spec, dict(sizes), _no_rows, own_data=True)
        from audits.mia_sets import client_rows
        from server_app.config.tasks import load_run_data

        @cache
        def load() -> tuple:
            task = load_run_data(cfg, data_dir)
            return task, client_rows(cfg.data, cfg.seed, task)

        if sizes is None:
            sizes = dict(enumerate(map(len, load()[1])))
        return cls(cfg.data.task_spec, dict(sizes), load)


def _no_rows() -> tuple:
    raise AssertionError("client-data = true: the server holds no client's rows")


def erasure_refusal(records: Mapping[int, Iterable[int]], labels: Sequence[int],
                    held: Holdings, before: Erasure, forgotten: Iterable[int] = (),
                    joined: int | None = None) -> Refusal | None:
    """Why ``records`` and ``labels`` cannot be erased after ``before`` (None: they can).

    The one check of a records or class request, wherever it comes from. An
    owner must have joined and not be forgotten; every id must be one its owner
    holds (positions ``0 .. held - 1`` of its partition, :mod:`task.records`),
    some of them not erased already; every owner must keep a record. A label
    must be a class of the task (a task with classes), and every client of
    ``before.clients`` keep a record after every erasure so far.

    Parameters
    ----------
    records : Mapping[int, Iterable[int]]
        Partition id -> record ids the request erases ({} for a class request).
    labels : Sequence[int]
        Classes the request erases on every client.
    held : Holdings
        What each client holds.
    before : Erasure
        The erasures in force before this request (:func:`in_force_of`), with
        ``clients`` the clients still in the run.
    forgotten : Iterable[int]
        Clients forgotten so far (or to be, by a request ahead of this one).
    joined : int, optional
        Clients joined so far (partition ids below it); None: not checked.

    Returns
    -------
    (str, str) or None
        ``("records" | "labels", one-line reason)``, or None.
    """
    records = {int(p): list(ids) for p, ids in records.items()}
    if labels and held.own_data:
        return "labels", ("a class request is checked against every client's labels, "
                          "and with client-data = true the server holds none (each "
                          "client reads its own folder); name records (--records)")
    late = sorted(p for p in records if joined is not None and p >= joined)
    if late:
        return "records", f"client(s) {late} have not joined yet"
    gone = sorted(set(records) & set(forgotten))
    if gone:
        return "records", f"client(s) {gone} are forgotten already: they hold no records"
    why = check_against_sizes(records, held.sizes)  # the ids alone, then with the rest
    if why:
        return "records", why
    new_ids = any(set(ids) - _erased(held, before, p) for p, ids in records.items())
    if not new_ids and not set(labels) - set(before.labels):
        what = "labels" if labels and not records else "records"
        return what, "every record it names is erased already (by an earlier request)"
    after = before.merged(records, labels)
    why = check_against_sizes(after.records, held.sizes)
    if why:
        return "records", why
    if not after.labels:
        return None
    why = label_refusal(held, after, labels)
    return ("labels", why) if why else None


def _erased(held: Holdings, before: Erasure, p: int) -> set[int]:
    """Client ``p``'s record ids ``before`` erases: named, or of an erased label."""
    erased = set(before.records.get(p, ()))
    if not before.labels:
        return erased
    task, rows = held.load()
    part = np.asarray(rows[p])
    keep = keep_mask(len(part), np.asarray(task.train_y)[part], (), before.labels)
    return erased | {int(i) for i in np.flatnonzero(~keep)}


def label_refusal(held: Holdings, after: Erasure, labels: Sequence[int]) -> str | None:
    """A class request's ``labels`` against the task, and what every client keeps."""
    task, rows = held.load()
    if not task.has_classes:
        return f"{held.spec}'s targets are not class labels: no class request"
    wrong = sorted(c for c in labels if not 0 <= c < task.num_classes)
    if wrong:
        return f"label(s) {wrong} are not classes 0..{task.num_classes - 1}"
    y = np.asarray(task.train_y)
    for p, part in enumerate(rows):
        if p in after.clients and not keep_mask(len(part), y[np.asarray(part)],
                                                after.records.get(p, ()),
                                                after.labels).any():
            return (f"client {p} would keep no record (it holds only labels "
                    f"{sorted(set(after.labels))} or erased records); forget the "
                    "client instead")
    return None


def records_of(request: Request) -> dict[int, list[int]]:
    """A records request's erased ids: client -> ids ({} for a client request)."""
    if not request.erasure:
        return {}
    return {int(p): list(ids) for p, ids in request.erasure.get("records", {}).items()}


def labels_of(request: Request) -> list[int]:
    """A class request's erased labels ([] for the other requests)."""
    return [int(c) for c in (request.erasure or {}).get("labels", [])]


def in_force_of(cfg: RunConfig, requests: Iterable[Request], forgotten: Iterable[int]
                ) -> Erasure:
    """The planned erasure and ``requests``' (records and class requests), merged.

    ``fresh`` is empty (it erases nothing new); records of ``forgotten`` clients
    are left out, and so are they from ``clients``.
    """
    done: dict[int, list[int]] = {}
    labels: set[int] = set()
    for request in requests:
        for p, ids in records_of(request).items():
            done.setdefault(p, []).extend(ids)
        labels.update(labels_of(request))
    merged = planned_erasure(cfg).merged(done, labels)
    gone = set(forgotten)
    return replace(merged, fresh=frozenset(),
                   records={p: ids for p, ids in merged.records.items() if p not in gone},
                   clients=tuple(p for p in merged.clients if p not in gone))


def asked(request: Request) -> Erasure:
    """The request's own erasure (its records and labels)."""
    return Erasure({p: tuple(ids) for p, ids in records_of(request).items()},
                   tuple(labels_of(request)))

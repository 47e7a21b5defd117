"""``forget``: requests to forget clients (or records, or classes) of a run.

``forget --run NAME --clients 3,17`` records one request (the clients' partition
ids) in the run's catalog (:class:`runstore.inbox.RequestInbox`) and prints
its id. A staged run that is still going takes it at its next stage boundary; a
finished run takes it at once (:mod:`cli.later`: the engine restarts on the run's
stored history and writes a new model version), or with ``--record-only`` later,
with ``forget --run NAME --pending``; ``receipts`` (:mod:`cli.receipts`) lists
what was done. The run folder is found as :mod:`cli.runs` says.
Nothing is recorded when the run does not exist, is a one-stage run still going,
or when a client is unknown, already forgotten or already named by a request; when
a records or class request names ids its owner does not hold, labels that are not
classes (or a task without classes), records all erased already, or would leave a
client no record, or names a client a pending request forgets
(:func:`server_app.admission.erasure_refusal`, the ServerApp's own check); nor,
for a finished run, when the request would leave a shard without a client or a
node folder its coded history needs is missing (``--lost-nodes`` accepts named
ones as lost, :func:`cli.later.check_later`), its plug-ins do not import or build,
it was moved, its summary.json or a model version does not match its record, or
its lost slices leave a round undecodable: one line on stderr, exit status 2.
A request that fails later for a reason a retry cannot fix is marked ``failed``
with its reason (``receipts`` lists it); one the ServerApp still refuses (recorded
meanwhile by another command) makes the command exit 2. Exit statuses:
docs/FAULTS.md, "Exit statuses".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cli.later import carry_out, check_later
from cli.later_route import ENGINES, HERE, route
from cli.runs import SUMMARY, open_inbox, parse_clients, run_folder, unfinished
from cli.terminal import Parser
from history.catalog import StoreError
from runstore.catalog import RunLog, RunLogError
from runstore.inbox import InboxError, RequestInbox
from runstore.summary import StageSummary
from runstore.versions import ModelVersion
from server_app.admission import later_refusal, run_shards
from server_app.config import ConfigError, RunConfig


def submit(name: str, clients: str, results_dir: str | None = None) -> str:
    """Record a request to forget ``clients`` in run ``name``; return its id.

    A finished run takes the request only if it could carry it out: no
    client already forgotten, and every shard keeps a client after the
    requests pending before it (:func:`server_app.admission.later_refusal`,
    the ServerApp's own rule).

    Raises
    ------
    ConfigError
        The run does not exist, or is a one-stage run still going; a client is
        unknown, forgotten or already requested, or (a finished run) its
        removal would leave a shard without a client. Nothing is recorded then.
    """
    folder = run_folder(name, results_dir)
    finished = (folder / SUMMARY).exists()
    with open_inbox(folder) as inbox:
        settings = inbox.settings()
        if not settings:
            raise ConfigError(f"--run {name!r} has not recorded its settings yet (it "
                              "is starting, or was stopped before): try again once "
                              "it runs")
        stages = int(settings.get("num-stages", 1))
        if stages < 2 and not finished:
            raise ConfigError(f"--run {name!r} has num-stages = {stages} and has not "
                              "finished: a one-stage run takes requests once it has "
                              "finished (or, staged, at its stage boundaries)")
        versions = inbox.versions()
        if finished and not versions:
            raise ConfigError(f"--run {name!r} has no model versions (made before "
                              "they existed): it cannot take later requests")
        ids = parse_clients(clients, int(settings["num-clients"]))
        gone = sorted(set(ids) & set(versions[-1].forgotten)) if finished else []
        if gone:
            raise ConfigError(f"--clients {clients!r}: client(s) {gone} are already "
                              f"forgotten (model version v{versions[-1].version})")
        reason = _later_refusal(folder, settings, versions[-1], ids, inbox) \
            if finished else None
        if reason is not None:
            raise ConfigError(f"--clients {clients!r}: {reason} (model version "
                              f"v{versions[-1].version}); nothing was recorded")
        try:
            return inbox.submit(ids).id
        except InboxError as err:  # checked and recorded in one transaction
            raise ConfigError(f"--clients {clients!r}: {err}") from None


def submit_records(name: str, client: str | None, ids: str | None,
                   results_dir: str | None = None, labels: str | None = None) -> str:
    """Record a request to erase records ``ids`` of ``client`` (or ``labels``) in ``name``.

    ``ids``: ``"3,18,40-52"`` (:func:`task.records.parse_ids`); ``labels``: classes
    to erase on every client (``"7"``; then no client and no ids). The run must be
    finished, or a staged run still going (the next stage boundary takes it).
    The request is checked as the ServerApp will check it
    (:func:`server_app.admission.erasure_refusal`: ids the owner holds, labels
    that are classes of a task with classes, every client keeping a record, not all
    erased already), after the requests recorded before it, in the transaction
    that records it. A records request for a client that a pending request
    forgets is refused: that request takes its records with it. Returns the
    request's id.

    Raises
    ------
    ConfigError
        One line naming the option and what is allowed; nothing is recorded.
    """
    folder = run_folder(name, results_dir)
    option = "--labels" if labels is not None else "--records"
    with open_inbox(folder) as inbox:
        settings, versions = inbox.settings(), inbox.versions()
        finished = (folder / SUMMARY).exists()
        if not settings or (finished and not versions) or (
                not finished and int(settings.get("num-stages", 1)) < 2):
            raise ConfigError(f"{option}: --run {name!r} takes no request now: records "
                              "go to a finished run (with model versions) or a staged "
                              "run still going")
        if labels is not None:
            records, wanted = {}, _parse(option, labels)
        else:
            owner = parse_clients(client, int(settings["num-clients"]))
            if len(owner) != 1:
                raise ConfigError(f"--clients {client!r}: --records names the records "
                                  "of one client")
            records, wanted = {owner[0]: _parse(option, ids)}, []
        check = _erasure_check(settings, versions[-1] if finished else None, records,
                               wanted, _reported_sizes(inbox, settings))
        try:
            return inbox.submit_records(records, wanted, check).id
        except InboxError as err:
            what = (f"--labels {labels[:80]!r}" if labels is not None else
                    f"--clients {client!r} --records {str(ids)[:80]!r}")
            raise ConfigError(f"{what}: {err}; nothing was recorded") from None


def _reported_sizes(inbox, settings: dict) -> dict[int, int] | None:
    """A ``client-data = true`` run's client sizes, as its nodes reported them.

    None: another run, or none recorded yet
    (:data:`runstore.catalog.CLIENT_RECORDS`).
    """
    from runstore.catalog import CLIENT_RECORDS

    text = inbox.get_meta(CLIENT_RECORDS) if settings.get("client-data") else None
    return None if text is None else {int(p): n for p, n in json.loads(text).items()}


def _erasure_check(settings: dict, latest: ModelVersion | None,
                   records: dict[int, list[int]], labels: list[int],
                   sizes: dict[int, int] | None = None):
    """The check :meth:`RequestInbox.submit_records` runs in its transaction.

    ``latest``: a finished run's latest model version (None: a staged run still
    going, whose later joins its boundary checks). The requests ahead of this
    one (pending or claimed) count as done: they are carried out first.
    ``sizes``: a ``client-data = true`` run's reported client sizes (its
    holdings; nothing of the dataset is read, :meth:`Holdings.of_run`).
    """
    from server_app.admission import Holdings, erasure_refusal, in_force_of
    from server_app.config.tasks import data_folder

    cfg = RunConfig.from_run_config(settings)
    # the data (or, client-data = true, the reported sizes), before the transaction
    held = Holdings.of_run(cfg, "" if cfg.data.client_data else data_folder(cfg),
                           sizes)

    def check(requests: list) -> str | None:
        ahead = [r for r in requests if r.state in ("pending", "claimed")]
        done = [r for r in requests if r.state == "done"]
        forgotten = set(latest.forgotten) if latest is not None else {
            p for r in done for p in r.clients}
        for request in ahead:  # a client request ahead takes its clients' records
            taken = sorted(set(request.clients) & set(records))
            if taken:
                return (f"client(s) {taken} are to be forgotten by request "
                        f"{request.id} ({request.state}): their records go with them "
                        "(--clients)")
        gone = forgotten | {p for r in ahead for p in r.clients}
        before = in_force_of(cfg, [*done, *ahead], gone)
        joined = cfg.data.num_clients if latest is not None else None
        refusal = erasure_refusal(records, labels, held, before, forgotten, joined)
        return None if refusal is None else refusal[1]

    return check


def _parse(option: str, ids: str) -> list[int]:
    """``--records`` / ``--labels`` ids (:func:`task.records.parse_ids`), or one line."""
    from task.records import parse_ids

    try:
        return parse_ids(ids)
    except ValueError as err:
        raise ConfigError(f"{option} {ids[:80]!r}: {err}; allowed: ids N or ranges "
                          "N-M, comma-separated, e.g. 3,18,40-52") from None


def _later_refusal(folder: Path, settings: dict, latest: ModelVersion,
                   ids: list[int], inbox: RequestInbox) -> str | None:
    """Why the finished run would refuse ``ids`` after its pending requests, or None.

    The pending requests go first, in order, each taken unless the same rule
    refuses it, as the ServerApp handles them. A client named by a pending
    request is left to :meth:`RequestInbox.submit` (``already requested``).

    Raises
    ------
    ConfigError
        A staged run's last stage result cannot be read back (one line).
    """
    pending = inbox.pending()
    if set(ids) & {p for r in pending for p in r.clients}:
        return None
    cfg = RunConfig.from_run_config(settings)
    if cfg.stages.staged:  # the last stage's clients, as the run recorded them
        last = f"stage:{cfg.stages.num_stages}"
        try:
            log = RunLog(folder / "run.sqlite", settings, read_only=True)
        except (StoreError, RunLogError) as err:
            raise ConfigError(str(err)) from None
        try:
            entry = log.done_as(last, StageSummary)
        except RunLogError as err:
            raise ConfigError(str(err)) from None
        finally:
            log.close()
        if entry is None:
            raise ConfigError(f"--run {folder.name!r}: {last} is not recorded as done "
                              "(a damaged run catalog?); restore it")
        present = entry.present_clients
    else:
        present = list(range(cfg.initial_clients))
    feds, joined = run_shards(cfg), cfg.data.num_clients  # finished: all have joined
    gone = set(latest.forgotten)
    for request in pending:
        if later_refusal(request.clients, joined, gone, present, feds) is None:
            gone |= set(request.clients)
    return later_refusal(ids, joined, gone, present, feds)


def _forget_parser(prog: str) -> argparse.ArgumentParser:
    """The ``forget`` command's options."""
    parser = Parser(
        prog=prog, description="Ask a run to forget clients: a staged run at its "
        "next stage boundary, a finished run at once (a new model version).")
    parser.add_run_options()
    parser.add_argument("--clients", default=None, help="partition ids, e.g. 3,17")
    parser.add_argument("--records", default=None, metavar="IDS",
                        help="finished run: erase only these records of the one "
                        "client --clients names (it stays), e.g. 3,18,40-52")
    parser.add_argument("--labels", default=None, metavar="LABELS",
                        help="erase every record of these classes on every client "
                        "(they stay), e.g. 7")
    parser.add_argument("--records-file", default=None, metavar="PATH",
                        help="as --records, the ids read from a file (commas, spaces "
                        "or newlines between them)")
    parser.add_argument("--record-only", action="store_true",
                        help="finished run: record the request for a later batch")
    parser.add_argument("--pending", action="store_true",
                        help="finished run: carry out the requests recorded before "
                        "(no new one)")
    parser.add_argument("--federation", default=None, metavar="NAME",
                        help="finished run: carry the request out on this federation "
                        "(a [superlink.NAME] connection; default: the one the run "
                        "recorded, for a run of the deployment engine)")
    parser.add_argument("--engine", default=None, choices=ENGINES,
                        help="finished run: where to carry the request out (default: "
                        "the engine the run ran on); 'simulation' replays a deployed "
                        "run on this machine from its copy of every client's data")
    parser.add_argument("--lost-nodes", default=None, metavar="IDS",
                        help="finished coded run: accept these clients' missing node "
                        "folders as lost (their slices count as erasures)")
    return parser


def main_forget(argv: list[str], prog: str) -> int:
    """The ``forget`` command; exit status 0 to 5 (docs/FAULTS.md, "Exit statuses").

    A live staged run takes the request at its next stage boundary; a finished
    run takes it at once (:func:`cli.later.carry_out`) unless ``--record-only``.
    Everything the engine will read back is checked before the request is
    recorded (:func:`cli.later.check_later`).

    Raises
    ------
    ConfigError
        A check failed before anything was recorded (exit status 2).
    """
    parser = _forget_parser(prog)
    args = parser.parse_args(argv)
    if (args.clients is None and args.labels is None) == (not args.pending):
        parser.error("give --clients (or --labels), or --pending (and neither)")
    if args.labels is not None and args.clients is not None:
        parser.error("--labels erases a class on every client: no --clients")
    if args.pending and args.record_only:
        parser.error("--pending carries out what is recorded: no --record-only")
    if args.records is not None and args.records_file is not None:
        parser.error("give --records or --records-file, not both")
    if (args.records or args.records_file) is not None and args.clients is None:
        parser.error("--records goes with --clients naming its one client")
    records = args.records if args.records_file is None else _ids_file(args.records_file)
    if args.lost_nodes is not None and args.record_only:
        parser.error("--lost-nodes goes with a request carried out now (no "
                     "--record-only)")
    folder = run_folder(args.run, args.results_dir)
    finished = (folder / SUMMARY).exists()
    if args.lost_nodes is not None and not finished:
        raise ConfigError(f"--lost-nodes {args.lost_nodes!r}: --run {args.run!r} has not "
                          "finished; node folders are checked for later requests only")
    # before the request is recorded (also one only recorded); once, for carry_out too
    made = check_later(folder, args.lost_nodes) if finished else []
    where = route(folder, args.engine, args.federation) if finished else HERE
    if records is not None or args.labels is not None:
        rid = submit_records(args.run, args.clients, records, args.results_dir,
                             args.labels)
        live = not (folder / SUMMARY).exists()
        what = (f"labels {args.labels.strip()}" if args.labels is not None
                else f"records of client {args.clients.strip()}")
        print(f"request {rid} recorded: {what} of run {args.run}" + (
            "; it is handled at the next stage boundary (see `receipts`)" if live
            else ""))
        if live or args.record_only:
            return 0
        if not finished:  # it finished while the request was recorded
            made = check_later(folder, None)
    elif args.clients is not None:
        rid = submit(args.run, args.clients, args.results_dir)
        live = not (folder / SUMMARY).exists()
        print(f"request {rid} recorded: clients {args.clients} of run {args.run}"
              + ("; it is handled at the next stage boundary (see `receipts`)" if live
                 else ""))
        if live or args.record_only:
            return 0
        if not finished:  # it finished while the request was recorded
            made = check_later(folder, None)
    elif not (folder / SUMMARY).exists():
        with open_inbox(folder) as inbox:
            versions = len(inbox.versions())
        raise ConfigError(f"--pending is for finished runs: {unfinished(folder, versions)}")
    return carry_out(folder, prog, made, where)


def _ids_file(path: str) -> str:
    """``--records-file``: its ids as ``--records`` takes them (``3,18,40-52``).

    Raises
    ------
    ConfigError
        The file cannot be read (one line naming it).
    """
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--records-file {path!r} cannot be read: {err}") from None
    lines = [line for line in text.lstrip("\ufeff").splitlines()
             if not line.strip().startswith("#")]  # a byte-order mark, comments
    ids = ",".join(" ".join(lines).replace(",", " ").split())
    if not ids:
        raise ConfigError(f"--records-file {path!r} names no id (ids N or ranges N-M, "
                          "separated by commas, spaces or newlines; # starts a comment)")
    from task.records import parse_ids

    try:
        parse_ids(ids)
    except ValueError as err:
        raise ConfigError(f"--records-file {path!r}: {err}") from None
    return ids

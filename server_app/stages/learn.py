"""The learning step of a stage: G rounds over the present clients into the history.

Every run learns through :func:`learn_rounds`: one fresh stock ``shard-strategy``
per shard over the stage's present clients (:func:`stage_strategy`), the run's
round loop, and the history store as an observer (paper Sec. 3.2: the server keeps
the intermediate parameters). :func:`learn_federation` is a whole learning of one
federation as a one-stage run does it (SE's shards, or FedEraser's own unsharded
federation): resumable from the run catalog, pruned, marked complete, and with
``storage = "coded"`` reopened as the coded history that fetches slices.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

from flwr.app import ArrayRecord

from history import CodedHistory, CodedRecorder, HistoryStore
from history.catalog import CATALOG_FILE
from runstore.summary import LearningSummary
from server_app.admission import present_shards
from server_app.config import RunConfig
from server_app.rounds.federation import Federation
from server_app.rounds.learning import Continuation, LearningResult, run_learning
from server_app.rounds.loop import RoundPlan
from server_app.run.context import RunContext
from server_app.unlearning.erasure import Erasure, erasing_loop
from strategies import ShardedStrategy, make_stock_strategy
from strategies.factory import SERVER_DEFAULTS
from strategies.sharded import to_record
from strategies.unlearning import FrozenShard


def stage_strategy(cfg: RunConfig, shards: Sequence[Sequence[int]],
                   present: Sequence[int], node_of: dict[int, int],
                   keep_empty: bool = False) -> ShardedStrategy:
    """One stock ``shard-strategy`` per shard over its ``present`` clients.

    Each shard samples ``min(clients-per-round / S, its present clients)``
    clients a round (seeded by the run seed and the round number). With
    ``keep_empty`` a shard with no present client keeps its model
    (:class:`strategies.unlearning.FrozenShard`): FR retraining an earlier stage
    whose clients of that shard were all forgotten since.

    Raises
    ------
    ValueError
        A shard with no present client (unless ``keep_empty``).
    """
    training = cfg.training
    per_round = training.clients_per_round // len(shards)
    here = present_shards(shards, present)
    for s, pids in enumerate(here):
        if not pids and not keep_empty:
            raise ValueError(f"shard {s} has no client present in this stage")
    subs = [make_stock_strategy(training.shard_strategy, min(per_round, len(pids)),
                                len(pids), **training.shard_strategy_options)
            if pids else FrozenShard() for pids in here]
    return ShardedStrategy(subs, [[node_of[p] for p in pids] for pids in here],
                           seed=cfg.seed)


def first_round(cfg: RunConfig, stage: int) -> int:
    """Number of stage ``stage``'s first round: ``(stage - 1) G + 1``."""
    return (stage - 1) * cfg.training.num_rounds + 1


def learn_rounds(ctx: RunContext, federation: Federation, store, models: list[ArrayRecord],
                 present: Sequence[int], label: str,
                 continuation: Continuation = Continuation(), *,
                 erasure: Erasure | None = None) -> LearningResult:
    """G rounds of ``federation``'s ``present`` clients from ``models`` into ``store``.

    Rounds are numbered from ``continuation.first``; each is scored by the central
    evaluator. ``continuation.resumed`` and ``continuation.checkpoint``: a checkpoint
    to go on from, and where to keep one after each round
    (:func:`server_app.rounds.learning.run_learning`). The changed clients of
    ``erasure`` (a staged run's records erased so far) train on what they keep.
    """
    strategy = stage_strategy(ctx.cfg, federation.shards, present, federation.node_of)
    plan = RoundPlan(ctx.cfg.training.num_rounds, ctx.train_config(), label)
    return run_learning(erasing_loop(ctx.loop, erasure), strategy, federation, models,
                        plan, store, evaluate=ctx.evaluator.evaluate,
                        continuation=continuation)


def open_store(root, federation: Federation) -> HistoryStore:
    """A staged run's one history store: a new one, or the one a killed run left."""
    if (root / CATALOG_FILE).exists():
        return HistoryStore.open(root, require_complete=False)
    return HistoryStore.create(root, federation.shard_of,
                               num_shards=len(federation.shards))


def learn_federation(ctx: RunContext, federation: Federation, name: str,
                     coded: bool = False) -> tuple[LearningSummary, list[ArrayRecord],
                                                   HistoryStore | CodedHistory]:
    """Learn ``federation`` for G rounds into ``history/<name>``, or take it back.

    A resumed run whose learning of ``name`` finished gets its summary, final
    shard models and store back (uncoded; coded slices lived in the lost run, so
    coded learning is redone). An interrupted uncoded learning goes on after the
    last round it finished (the catalog's checkpoint, :func:`_resumable`), with
    the same models a run never killed has (seeded); otherwise it is redone from
    scratch, its partial store removed first.

    Returns
    -------
    (LearningSummary, list[ArrayRecord], history store)
        With ``coded`` the store is the :class:`CodedHistory` that fetches and
        decodes the clients' slices.
    """
    catalog, root = ctx.catalog, ctx.folder.history_dir(name)
    done = catalog.done_as(f"learn:{name}", LearningSummary)
    if done is not None and not coded:
        store = HistoryStore.open(root)
        models = [to_record(store.shard_model(s, ctx.cfg.training.num_rounds))
                  for s in range(len(federation.shards))]
        ctx.log(f"resumed: {name} learning already done")
        return done, models, store
    resumed = None if coded else _resumable(ctx, name, root)
    if root.exists() and resumed is None:  # coded: slices lived in the lost run
        shutil.rmtree(root)
    if resumed is None:
        catalog.begin(f"learn:{name}")
    result, store = _learn_into_store(ctx, federation, name, coded, resumed)
    summary = LearningSummary.of(result)
    catalog.finish(f"learn:{name}", summary.to_json())
    return summary, result.models, store


def _resumable(ctx: RunContext, name: str, root) -> dict | None:
    """The checkpoint an interrupted learning of ``name`` goes on from, or None.

    None (learn again from W^0) when no round finished, when the store is
    missing, or when the shard strategy keeps state between rounds that the
    checkpoint does not hold (:data:`strategies.factory.SERVER_DEFAULTS`: a
    server learning rate or momentum). Rounds the killed run stored after the
    checkpoint's are removed from the store first.
    """
    record = ctx.catalog.in_progress(f"learn:{name}")
    if (not isinstance(record, dict) or not (root / CATALOG_FILE).exists()
            or ctx.cfg.training.shard_strategy in SERVER_DEFAULTS):
        return None
    store = HistoryStore.open(root, require_complete=False)
    freed = store.truncate_after(record["round"])
    store.close()
    ctx.log(f"resumed: {name} learning goes on after round {record['round']} "
            f"({freed} bytes of later rounds dropped)")
    return record


def _learn_into_store(ctx: RunContext, federation: Federation, name: str, coded: bool,
                      resumed: dict | None = None):
    cfg = ctx.cfg

    def keep(record: dict) -> None:  # what a killed run goes on from
        ctx.catalog.progress(f"learn:{name}", record)

    if resumed is not None:
        store = HistoryStore.open(ctx.folder.history_dir(name), require_complete=False)
        w0 = [to_record(store.shard_model(s, resumed["round"]))
              for s in range(len(federation.shards))]
        result = learn_rounds(ctx, federation, store, w0, list(federation.node_of),
                              name, Continuation(resumed=resumed, checkpoint=keep))
        return _complete(ctx, federation, store, name, result, coded)
    if coded:
        store = CodedRecorder.create(
            ctx.folder.history_dir(name), federation, cfg.coded_blocks_per_shard,
            cfg.storage.quant_scale_bits, ctx.slice_transfer(),
            privacy_t=cfg.storage.privacy_t)
    else:
        store = HistoryStore.create(ctx.folder.history_dir(name), federation.shard_of,
                                    num_shards=len(federation.shards))
    w0 = [ctx.initial_model()] * len(federation.shards)
    result = learn_rounds(ctx, federation, store, w0, list(federation.node_of), name,
                          Continuation(checkpoint=None if coded else keep))
    return _complete(ctx, federation, store, name, result, coded)


def _complete(ctx: RunContext, federation: Federation, store, name: str,
              result: LearningResult, coded: bool):
    """Prune (uncoded) and close a finished learning's store; reopen a coded one."""
    cfg = ctx.cfg
    if not coded:  # SE replays from first participations; FedEraser from round 1
        freed = store.prune_models(cfg.unlearning.calibration_interval
                                   if name == "sharded" else None)
        ctx.log(f"{name} history: {freed} bytes of shard models no replay can start "
                "from dropped")
    store.mark_complete()
    if coded:
        store.close()
        store = CodedHistory.open(store.root, ctx.grid, federation.node_of,
                                  transfer=ctx.slice_transfer())
    return result, store

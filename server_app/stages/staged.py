"""Staged runs: a federation that lives on, learning and forgetting stage by stage.

A run with ``num-stages`` > 1 is a sequence of stages (paper Sec. 3.1). Stage t:

1. its clients (:class:`server_app.stages.churn.Membership`: clients that joined, minus
   those that left or were forgotten) learn ``num-rounds`` rounds, numbered
   ``(t - 1) G + 1 .. t G``, from the shard models the previous stage ended
   with; every round goes to the one history store of the run, which so spans
   the stages;
2. the requests received during the stage (``requests-per-stage`` seeded ones,
   then those of the ``forget`` command, :mod:`server_app.run.inbox`) are handled
   one after the other: SE replays each impacted shard from the first stored
   round, in whatever stage, in which a forgotten client took part (forgetting
   is cumulative, so the stored models before that round never saw a forgotten
   client), and FR, if asked, retrains every stage so far from W^0 without the
   forgotten clients (:func:`retrain_stages`);
3. a receipt is written per request (:mod:`server_app.run.receipts`), and the next
   stage goes on from SE's models.

A stage's result and models are kept in the run catalog as soon as it ends, so a
killed run resumes at the stage it was in (seeded, it redoes that stage the
same way, its requests included).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from history import HistoryStore
from server_app.config.run_config import RunConfig
from server_app.config.stages import initial_clients
from server_app.evaluation.central import CentralEvaluator
from server_app.rounds.federation import Federation
from server_app.rounds.learning import LearningResult, run_learning
from server_app.rounds.loop import CostMeter
from server_app.rounds.screening import FaultLog
from server_app.run.inbox import Request, RequestInbox
from server_app.run.receipts import shard_digests, utc, write_receipt
from server_app.stages.churn import Churn, Membership, lineage_shards, present_shards
from server_app.unlearning.driver import accumulate, drive, run_unlearning
from server_app.unlearning.frameworks import Stage, UnlearningSettings
from strategies import ShardedStrategy, make_stock_strategy
from strategies.unlearning import FrozenShard

__all__ = ["StagedRun", "learn_stage", "retrain_stages", "stage_strategy",
           "staged_federations"]


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
    per_round = cfg.clients_per_round // len(shards)
    here = present_shards(shards, present)
    for s, pids in enumerate(here):
        if not pids and not keep_empty:
            raise ValueError(f"shard {s} has no client present in this stage")
    subs = [make_stock_strategy(cfg.shard_strategy, min(per_round, len(pids)),
                                len(pids), **cfg.shard_strategy_options)
            if pids else FrozenShard() for pids in here]
    return ShardedStrategy(subs, [[node_of[p] for p in pids] for pids in here],
                           seed=cfg.seed)


def first_round(cfg: RunConfig, stage: int) -> int:
    """Number of stage ``stage``'s first round: ``(stage - 1) G + 1``."""
    return (stage - 1) * cfg.num_rounds + 1


def learn_stage(grid: Grid, cfg: RunConfig, federation: Federation, store,
                models: list[ArrayRecord], member: Membership, train_config: ConfigRecord,
                evaluator: CentralEvaluator | None = None,
                faults: FaultLog | None = None) -> LearningResult:
    """G rounds of stage ``member.stage`` over its present clients, into ``store``.

    Then the stored shard models no replay can start from are dropped
    (:meth:`history.HistoryStore.prune_models`).
    """
    strategy = stage_strategy(cfg, federation.shards, member.present, federation.node_of)
    result = run_learning(grid, strategy, federation, models, cfg.num_rounds,
                          train_config, store,
                          evaluate=evaluator.evaluate if evaluator else None,
                          timeout=cfg.round_timeout, label=f"stage {member.stage} learn",
                          faults=faults, first_round=first_round(cfg, member.stage))
    store.prune_models(cfg.calibration_interval)  # only what a replay can start from
    return result


def retrain_stages(grid: Grid, cfg: RunConfig, baseline: Federation,
                   members: Sequence[Membership], forgotten: set[int],
                   initial: ArrayRecord, train_config: ConfigRecord,
                   faults: FaultLog | None = None, label: str = "FR"
                   ) -> tuple[list[ArrayRecord], CostMeter]:
    """FedRetrain over stages: every stage's rounds again, from W^0, without ``forgotten``.

    Stage t's rounds sample from its present clients minus ``forgotten``, with
    the learning's strategy, seeds and round numbers (:func:`stage_strategy`), so
    the models are those of a run in which the forgotten clients never existed;
    a shard none of whose clients of stage t remains keeps its model in t.
    Returns the shard models (``baseline-shards`` of them) and the summed costs.
    """
    models = [initial] * len(baseline.shards)
    total = CostMeter(cfg.link_rate_mbps)
    for member in members:
        present = [p for p in member.present if p not in forgotten]
        strategy = stage_strategy(cfg, baseline.shards, present, baseline.node_of,
                                  keep_empty=True)
        models, meter = drive(grid, strategy, models, cfg.num_rounds, train_config,
                              cfg.link_rate_mbps, cfg.round_timeout, faults,
                              f"{label} stage {member.stage}", baseline.partition_of,
                              baseline.samples, first_round=first_round(cfg, member.stage))
        accumulate(total, meter)
    return models, total


def staged_federations(cfg: RunConfig, node_of: dict[int, int], samples: dict
                       ) -> tuple[Federation, Federation]:
    """SE's federation (``num-shards``) and FR's (``baseline-shards``), every client.

    Shards are lineages (:func:`server_app.stages.churn.lineage_shards`).
    """
    first = initial_clients(cfg)
    return tuple(Federation(node_of, lineage_shards(cfg.num_clients, first, s, cfg.seed),
                            samples) for s in (cfg.num_shards, cfg.baseline_shards))


@dataclass
class StagedRun:
    """One staged run's state: federations, store, churn, inbox and results so far.

    Build with :meth:`create`; :meth:`run_stage` runs one stage.
    """

    grid: Grid
    cfg: RunConfig
    federation: Federation
    baseline: Federation
    store: HistoryStore
    evaluator: CentralEvaluator
    train_config: ConfigRecord
    initial: ArrayRecord
    inbox: RequestInbox
    churn: Churn
    folder: object
    faults: FaultLog
    models: list[ArrayRecord] = field(default_factory=list)
    members: list[Membership] = field(default_factory=list)
    forgotten: set[int] = field(default_factory=set)
    stages: list[dict] = field(default_factory=list)
    fr_models: list[ArrayRecord] = field(default_factory=list)
    scores: dict = field(default_factory=dict)
    """Accuracy, loss and shard accuracy of :attr:`models` (evaluated once each)."""

    @classmethod
    def create(cls, grid: Grid, cfg: RunConfig, federations: tuple[Federation, Federation],
               store: HistoryStore, evaluator: CentralEvaluator,
               train_config: ConfigRecord, initial: ArrayRecord, folder,
               faults: FaultLog) -> StagedRun:
        """A run at its start: stage 1 next, every shard at W^0.

        ``federations``: SE's and FR's (:func:`staged_federations`).
        """
        federation, baseline = federations
        churn = Churn(federation.shards, initial_clients(cfg), cfg.joins_per_stage,
                      cfg.leaves_per_stage, cfg.seed)
        run = cls(grid, cfg, federation, baseline, store, evaluator, train_config,
                  initial, RequestInbox(folder.runlog_path), churn, folder, faults)
        run.models = [initial] * len(federation.shards)
        return run

    def restore(self, entry: dict, models: list[ArrayRecord]) -> None:
        """Take back a stage finished before a crash (its summary entry and models)."""
        self.members.append(Membership(entry["stage"], entry["present_clients"],
                                       entry["joined"], entry["left"]))
        self.forgotten |= set(entry["forgotten"])
        self.stages.append(entry)
        self.models = models
        self.scores = {k: entry[k] for k in ("accuracy", "loss", "shard_accuracy")}

    def next_member(self) -> Membership:
        """Membership of the next stage (stage 1, or the last one advanced)."""
        if not self.members:
            return self.churn.first()
        return self.churn.advance(self.members[-1], self.forgotten)

    def run_stage(self) -> dict:
        """Learn one stage, handle its requests; return its summary entry."""
        member = self.next_member()
        self.members.append(member)
        result = learn_stage(self.grid, self.cfg, self.federation, self.store,
                             self.models, member, self.train_config, self.evaluator,
                             self.faults)
        self.models = result.models
        last = result.rounds[-1]  # the models' scores, kept up to date per request
        self.scores = {k: last[k] for k in ("accuracy", "loss", "shard_accuracy")}
        entry = self._entry(member, result)
        for request in self._claim(member, entry):
            entry["requests"].append(request.id)
            self._handle(member, request, entry)
        entry.update(self.scores)
        self.stages.append(entry)
        return entry

    def _entry(self, member: Membership, result: LearningResult) -> dict:
        last = result.rounds[-1]
        return {"stage": member.stage, "present": len(member.present),
                "present_clients": list(member.present), "joined": member.joined,
                "left": member.left, "forgotten": [], "requests": [],
                "rounds": [first_round(self.cfg, member.stage),
                           first_round(self.cfg, member.stage + 1) - 1],
                "learning": {"accuracy": last["accuracy"], "loss": last["loss"],
                             "shard_accuracy": last["shard_accuracy"],
                             "shard_loss": last["shard_loss"],
                             "compute_s": result.compute_s,
                             "client_epochs": result.client_epochs,
                             "wall_time_s": result.wall_time_s,
                             "rounds": result.rounds},
                "unlearning": {}, "warnings": member.warnings + result.warnings}

    def _claim(self, member: Membership, entry: dict) -> list[Request]:
        """The stage's requests: the pending ones, then its seeded ones (drawn once)."""
        claimed = self.inbox.claim(member.stage)
        if self.cfg.requests_per_stage and not any(r.source == "planned"
                                                   for r in claimed):
            try:
                planned = self.churn.requests(
                    member, self.forgotten | self.inbox.named_clients(),
                    self.cfg.requests_per_stage, self.cfg.clients_per_request,
                    self.cfg.request_distribution)
            except ValueError as err:
                entry["warnings"].append(f"{err}: no seeded request this stage")
                planned = []
            self.inbox.submit_all(planned, "planned", stage=member.stage,  # all or none
                                  unique=False)
            claimed = self.inbox.claim(member.stage)
        # requests that arrived during the stage first, then the seeded draw
        order = {"command": 0, "planned": 1}
        return sorted(claimed, key=lambda r: order.get(r.source, 2))

    def refusal(self, member: Membership, request: Request) -> str | None:
        """Why ``request`` cannot be carried out at this boundary (None: it can)."""
        joined = initial_clients(self.cfg) + (member.stage - 1) * self.cfg.joins_per_stage
        late = [p for p in request.clients if p >= joined]
        if late:
            return f"client(s) {late} have not joined by stage {member.stage}"
        if all(p in self.forgotten for p in request.clients):
            return "every client of the request is already forgotten"
        gone = self.forgotten | set(request.clients)
        for fed, what in ((self.federation, "shard"), (self.baseline, "FR shard")):
            here = present_shards(fed.shards, (p for p in member.present if p not in gone))
            empty = [s for s, pids in enumerate(here) if not pids]
            if empty:
                return (f"{what}(s) {empty} would keep no present client; the "
                        "federation could not go on learning")
        return None

    def _handle(self, member: Membership, request: Request, entry: dict) -> None:
        receipt = {"request_id": request.id, "clients": request.clients,
                   "source": request.source, "received_at": utc(request.received),
                   "stage": member.stage}
        reason = self.refusal(member, request)
        if reason is not None:
            receipt.update(status="refused", reason=reason, done_at=utc(time.time()))
            self.inbox.finish(request.id, "refused", reason, receipt)
            self.file_receipt(receipt, entry["warnings"])
            entry["warnings"].append(f"request {request.id} refused: {reason}")
            return
        receipt.update(self._unlearn(member, request))
        receipt.update(status="done", done_at=utc(time.time()))
        self.inbox.finish(request.id, "done", receipt=receipt)  # the record, then the file
        self.file_receipt(receipt, entry["warnings"])
        entry["forgotten"] += sorted(set(request.clients))
        for name, cost in receipt["cost"].items():
            into = entry["unlearning"].setdefault(name, {"compute_s": 0.0,
                                                         "client_epochs": 0.0,
                                                         "modelled_wall_s": 0.0})
            for key in into:
                into[key] += cost[key]

    def file_receipt(self, receipt: dict, warnings: list[str]) -> None:
        """Write ``receipt``'s file; one it cannot write is a warning, not a crash.

        The receipt is already kept in ``run.sqlite`` (:meth:`RequestInbox.finish`),
        from which summary.json is built and the file is written again at the end.
        """
        try:
            write_receipt(self.folder.path, receipt)
        except OSError as err:
            warnings.append(f"receipt of request {receipt['request_id']} not written "
                            f"({err}); it is kept in {self.inbox.catalog_path}")

    def _unlearn(self, member: Membership, request: Request) -> dict:
        """SE (and FR) for one request; the run goes on from SE's models."""
        before = shard_digests(self.models)
        accuracy_before = self.scores["accuracy"]
        stage = Stage(UnlearningSettings.from_config(self.cfg), self.federation,
                      self.baseline, self.store, None, self.models, self.initial,
                      self.train_config)
        se = run_unlearning(self.grid, stage, [request.clients], self.evaluator.evaluate,
                            already_forgotten=sorted(self.forgotten),
                            faults=self.faults, frameworks=["SE"])["SE"]
        self.forgotten |= set(request.clients)
        self.models = se.models
        self.scores = {"accuracy": se.summary.accuracy, "loss": se.summary.loss,
                       "shard_accuracy": se.summary.shard_accuracy}
        cost = se.summary.requests[-1]
        out = {"shards_retrained": cost.impacted_shards,
               "rounds_replayed": cost.rounds_replayed,
               "replay": cost.replay,
               "models_sha256": {"before": before, "after": shard_digests(se.models)},
               "accuracy": {"before": accuracy_before, "after": se.summary.accuracy},
               "cost": {"SE": {"client_epochs": cost.client_epochs,
                               "compute_s": cost.compute_s,
                               "modelled_wall_s": cost.modelled_wall_s,
                               "wall_s": cost.wall_s}},
               "verification": None}
        if "FR" in self.cfg.framework_list:
            out["cost"]["FR"], out["accuracy"]["FR"] = self._retrain()
        return out

    def _retrain(self) -> tuple[dict, float]:
        models, meter = retrain_stages(self.grid, self.cfg, self.baseline, self.members,
                                       self.forgotten, self.initial, self.train_config,
                                       self.faults)
        self.fr_models = models
        return ({"client_epochs": meter.client_epochs, "compute_s": meter.compute_s,
                 "modelled_wall_s": meter.modelled_wall_s, "wall_s": meter.wall_s},
                self.evaluator.evaluate(models)["accuracy"])

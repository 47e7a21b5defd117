"""A run's plan: what it will do, settled once before any engine starts.

:func:`plan_run` builds the part that needs only the settings (SE's shards, the
planned requests and no-ops, the notes on settings carried out in a reduced
form); preflight checks it, the ServerApp builds it again from the same settings
(the launcher and the ServerApp may be different processes) and completes it
with what the nodes report (:meth:`RunPlan.with_nodes`). The stages read the
plan; nothing changes it after discovery.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType

from server_app.admission import split_shards
from server_app.config import RunConfig
from server_app.rounds.federation import Federation
from server_app.unlearning.plan import baseline_sampling_notes, plan_requests

Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class RunPlan:
    """What a run will do: its shards, requests and nodes.

    Attributes
    ----------
    shards : tuple of tuple of int
        SE's shards, partition ids (:func:`server_app.admission.split_shards`
        of ``num-shards``: lineages for a staged run).
    baseline_shards : tuple of tuple of int
        The baselines' shards, split the same way in ``baseline-shards``.
    requests : tuple of tuple of int
        A one-stage run's planned requests (partition ids, each sorted as
        planned); empty for a staged run, a records or class-level request, or
        a run without frameworks.
    noops : tuple of dict
        Planned requests that change nothing
        (:func:`server_app.unlearning.requests.validate_requests`).
    notes : tuple of str
        Settings carried out in a reduced form (summary.json ``notes``).
    samples : mapping of int to int
        Partition id -> training samples the client holds (after discovery: as
        bounded by what each node reported); empty until known.
    node_of : mapping of int to int
        Partition id -> node id, from discovery; empty before.
    """

    shards: Groups
    baseline_shards: Groups
    requests: Groups = ()
    noops: tuple[dict, ...] = ()
    notes: tuple[str, ...] = ()
    samples: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    node_of: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))

    def request_lists(self) -> list[list[int]]:
        """The planned requests as lists (what the frameworks and summary.json take)."""
        return [list(r) for r in self.requests]

    def shard_lists(self) -> list[list[int]]:
        """SE's shards as lists (what a federation is built from)."""
        return [list(s) for s in self.shards]

    def federations(self) -> tuple[Federation, Federation]:
        """SE's federation and the baselines', over the nodes discovery found."""
        node_of, samples = dict(self.node_of), dict(self.samples)
        return tuple(Federation(node_of, [list(s) for s in shards], samples)
                     for shards in (self.shards, self.baseline_shards))

    def forgotten(self) -> list[int]:
        """Every client some planned request forgets, sorted."""
        return sorted({p for r in self.requests for p in r})

    def with_requests(self, requests: list[list[int]]) -> RunPlan:
        """The plan with ``requests`` as recorded in the run catalog (a resume's)."""
        return replace(self, requests=_groups(requests))

    def with_notes(self, notes: list[str]) -> RunPlan:
        """The plan with ``notes`` added after its own."""
        return replace(self, notes=self.notes + tuple(notes))

    def with_nodes(self, node_of: dict[int, int], samples: dict[int, int]) -> RunPlan:
        """The plan completed by discovery: the node map and the clients' sizes."""
        return replace(self, node_of=MappingProxyType(dict(node_of)),
                       samples=MappingProxyType(dict(samples)))


def plan_run(cfg: RunConfig) -> RunPlan:
    """The plan of the run ``cfg`` that needs no node and no data.

    Raises
    ------
    server_app.config.ConfigError
        As :func:`server_app.unlearning.plan.plan_requests` (a request that would
        empty a shard).
    """
    # a staged run takes its requests stage by stage (server_app.stages)
    requests, noops = ([], []) if cfg.stages.staged else plan_requests(cfg)
    return RunPlan(_groups(split_shards(cfg, cfg.training.num_shards)),
                   _groups(split_shards(cfg, cfg.unlearning.baseline_shards)),
                   _groups(requests), tuple(noops),
                   tuple(baseline_sampling_notes(cfg, requests)))


def _groups(lists: list[list[int]]) -> Groups:
    return tuple(tuple(int(p) for p in group) for group in lists)

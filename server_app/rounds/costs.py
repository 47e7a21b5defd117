"""The cost model: modelled seconds of training, transfers and server work.

Every modelled time of a run (``modelled_wall_s`` and its ``wall_breakdown``) is
computed here from what a round did (samples, local epochs, bytes, parameters,
updates combined) and the run's device profile
(:mod:`server_app.config.profile`), never from a clock, so the same run config
gives the same modelled seconds, bit for bit, however busy the machine is:

- a client's training: ``samples x local epochs x train_s_per_sample`` (+
  ``min(fisher-samples, samples) x fisher_s_per_sample`` for RapidRetrain's
  Fisher estimate), x the client's straggler factor;
- a transfer: ``base_delay_s + 8 x bytes / (link rate in Mbit/s x 1e6)``
  (paper Sec. 5: 0.1 s base delay; :func:`history.comm.transfer_seconds`);
- a shard server's configure step: ``models sent x parameters x
  configure_s_per_param``; its aggregation: ``updates combined x parameters x
  aggregate_s_per_param``; a coded decoding: ``slice values x blocks x
  decode_s_per_op``.

docs/DESIGN.md, "The cost model".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from history.comm import BASE_DELAY_S, transfer_seconds
from server_app.config.profile import DeviceProfile, Stragglers, TaskCost


@dataclass(frozen=True)
class CostModel:
    """One run's prices: a task's per-sample costs on a device, its link and server.

    The default (every price 0, 100 Mbit/s, 0.1 s delay) models transfers only:
    the loop's tests use it; a run builds its own with :meth:`of`.

    Attributes
    ----------
    task : TaskCost
        Seconds per training sample and per Fisher sample.
    link_rate_mbps : float
        Link rate, Mbit/s (> 0).
    base_delay_s : float
        Fixed seconds of one transfer.
    configure_s_per_param, aggregate_s_per_param, decode_s_per_op : float
        Server seconds per parameter of a model sent, per parameter of an update
        combined, per multiply-add of coded decoding.
    stragglers : Stragglers
        Which clients train slower.
    profile, digest, task_name : str
        The device profile (name, SHA-256) and the task the prices are for.
    estimated : bool
        The profile lacks the task: its costs are the fallback estimate.
    measured : bool
        The profile was measured by the calibration benchmark.
    """

    task: TaskCost = TaskCost(0.0, 0.0)
    link_rate_mbps: float = 100.0
    base_delay_s: float = BASE_DELAY_S
    configure_s_per_param: float = 0.0
    aggregate_s_per_param: float = 0.0
    decode_s_per_op: float = 0.0
    stragglers: Stragglers = field(default_factory=Stragglers)
    profile: str = ""
    digest: str = ""
    task_name: str = ""
    estimated: bool = False
    measured: bool = False

    @classmethod
    def of(cls, profile: DeviceProfile, task_name: str, link_rate_mbps: float,
           parameters: int) -> CostModel:
        """The prices of ``task_name`` on ``profile``.

        Parameters
        ----------
        profile : DeviceProfile
            The run's profile (run-config ``device-profile``).
        task_name : str
            :attr:`task.interface.Task.name`.
        link_rate_mbps : float
            Run-config ``link-rate-mbps``, used when the profile names no rate.
        parameters : int
            The task's model's parameter count (the fallback estimate's size).
        """
        task, estimated = profile.task_cost(task_name, parameters)
        server = profile.server
        return cls(task, profile.link_rate_mbps or link_rate_mbps, profile.base_delay_s,
                   server["configure_s_per_param"], server["aggregate_s_per_param"],
                   server["decode_s_per_op"], profile.stragglers, profile.name,
                   profile.digest, task_name, estimated, profile.measured)

    def train_s(self, partition: int, samples: float, epochs: float,
                fisher_samples: int = 0) -> float:
        """Modelled seconds of one client's local training.

        Parameters
        ----------
        partition : int
            The client's partition id (its straggler draw).
        samples : float
            Samples it trains on (a reply's ``num-examples``).
        epochs : float
            Local epochs it ran (a reply's ``local-epochs``; fractions allowed).
        fisher_samples : int
            Per-sample gradients of a Fisher estimate (RapidRetrain; 0: none),
            at most ``samples`` of them.

        Returns
        -------
        float
            Seconds.
        """
        seconds = samples * epochs * self.task.train_s_per_sample
        if fisher_samples:
            seconds += min(fisher_samples, samples) * self.task.fisher_s_per_sample
        return seconds * self.stragglers.factor(partition)

    def transfer_s(self, nbytes: int) -> float:
        """Modelled seconds of one transfer of ``nbytes`` bytes."""
        return transfer_seconds(nbytes, self.link_rate_mbps, self.base_delay_s)

    def transfers_s(self, count: int, nbytes: float) -> float:
        """Modelled seconds of ``count`` transfers of ``nbytes`` bytes in all, in turn."""
        return count * self.base_delay_s + 8.0 * nbytes / (self.link_rate_mbps * 1e6)

    def configure_s(self, models_sent: int, parameters: int) -> float:
        """A shard server's seconds to configure a round that sends ``models_sent``."""
        return models_sent * parameters * self.configure_s_per_param

    def aggregate_s(self, updates: int, parameters: int) -> float:
        """A shard server's seconds to combine ``updates`` updates of ``parameters``."""
        return updates * parameters * self.aggregate_s_per_param

    def decode_s(self, ops: int) -> float:
        """Seconds of a coded decoding of ``ops`` multiply-adds (slice values x blocks)."""
        return ops * self.decode_s_per_op

    def describe(self) -> dict:
        """summary.json ``cost_model``: the profile, its digest and the prices used."""
        return {"profile": self.profile, "digest": self.digest, "measured": self.measured,
                "task": self.task_name, "estimated": self.estimated,
                "train_s_per_sample": self.task.train_s_per_sample,
                "fisher_s_per_sample": self.task.fisher_s_per_sample,
                "link_rate_mbps": self.link_rate_mbps, "base_delay_s": self.base_delay_s,
                "configure_s_per_param": self.configure_s_per_param,
                "aggregate_s_per_param": self.aggregate_s_per_param,
                "decode_s_per_op": self.decode_s_per_op,
                "stragglers": {"fraction": self.stragglers.fraction,
                               "slowdown": self.stragglers.slowdown,
                               "seed": self.stragglers.seed}}

"""Rounds to target: when a from-scratch baseline first matches the original model.

RapidRetrain's claim is that it needs fewer rounds than FedRetrain, not less work
per round. :class:`TargetWatch` is an observer of the round loop
(:mod:`server_app.rounds.loop`): after each round it scores the shard models with the
central evaluator and notes the first round whose test loss is at most the
original model's (the learned shard ensemble), with the cost meter's totals at
that round. The framework still runs its G rounds (its final model and costs are
the headline figures, comparable with the other frameworks); the watch only
reports when the target was crossed. It stops evaluating once the target is met.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from flwr.app import ArrayRecord

from server_app.rounds.loop import CostMeter, RoundOutcome


class TargetWatch:
    """Observer: the first round whose test loss is at most ``target_loss``.

    Parameters
    ----------
    evaluate : Callable[[list[ArrayRecord]], dict]
        Scores shard models; must return ``loss`` (nats, float).
    target_loss : float
        The original model's test loss (finite).
    meter : CostMeter
        The run's cost meter; it must observe each round before this watch.

    Raises
    ------
    ValueError
        ``target_loss`` not a finite number.
    """

    def __init__(self, evaluate: Callable[[Sequence[ArrayRecord]], dict],
                 target_loss: float, meter: CostMeter) -> None:
        if not float("-inf") < float(target_loss) < float("inf"):
            raise ValueError(f"target loss {target_loss!r} must be finite")
        self.evaluate = evaluate
        self.target_loss = float(target_loss)
        self.meter = meter
        self.losses: list[float] = []
        self.reached: dict | None = None

    def on_round(self, outcome: RoundOutcome) -> None:
        """Score the round's models until the target is met; note the crossing."""
        if self.reached is not None:
            return
        loss = float(self.evaluate(list(outcome.after))["loss"])
        self.losses.append(loss)
        if loss <= self.target_loss:
            self.reached = {
                "round": outcome.rnd, "loss": loss,
                "compute_s": self.meter.compute_s,
                "modelled_wall_s": self.meter.modelled_wall_s,
                "client_epochs": self.meter.client_epochs,
            }

    def result(self) -> dict:
        """The watch's findings as a JSON-ready dict.

        ``target_loss``, ``reached`` (bool), ``losses`` (per round evaluated)
        and, when reached, ``round``, ``loss`` and the costs up to that round
        (``compute_s``, ``modelled_wall_s``, ``client_epochs``).
        """
        out = {"target_loss": self.target_loss, "reached": self.reached is not None,
               "losses": list(self.losses)}
        out.update(self.reached or {})
        return out

"""Which stored shard models unlearning can still need (the rest is dropped).

SE replays an impacted shard from p, the last round of FedEraser's plan
(stored rounds r with (r - 1) mod dt = 0) at or before g0, the first round in
which a forgotten client took part, and starts from the stored W^(p-1)
(``strategies.replay.CalibratedRetraining``). g0 is always some client's
first round in that shard, so only W^(p(g0) - 1) over those first rounds can be
a starting point; FedEraser replays from round 1 and needs W^0 only. Every
client update stays (calibration reads them), and W^0 and the last stored model
stay (the start of everything, and of a resumed run).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def plan_start(rounds: Sequence[int], g0: int, interval: int) -> int | None:
    """p: the last stored round r <= g0 with (r - 1) mod ``interval`` = 0 (or None)."""
    starts = [r for r in rounds if r <= g0 and (r - 1) % interval == 0]
    return max(starts) if starts else None


def needed_models(rounds: Sequence[int], first_rounds: Iterable[int], last: int,
                  interval: int | None) -> set[int]:
    """Rounds r whose W^r must stay for one shard.

    Parameters
    ----------
    rounds : Sequence[int]
        The shard's stored rounds with updates (>= 1), ascending.
    first_rounds : Iterable[int]
        Each client's first stored round in the shard.
    last : int
        The last stored round (its model is kept).
    interval : int or None
        SE's calibration interval dt (replay from the first participation);
        None: FedEraser's replay from round 1 (W^0 only).

    Returns
    -------
    set[int]
        0, ``last``, and with ``interval`` p(g0) - 1 for every first round g0,
        and p(last + 1) - 1: a client whose first round is still to come starts
        there when the rounds before it bring no plan round with updates.
    """
    keep = {0, last}
    if interval is None:
        return keep
    for g0 in set(first_rounds) | {last + 1}:  # last + 1: a client's first round to come
        p = plan_start(rounds, g0, interval)
        if p is not None:
            keep.add(p - 1)
    return keep

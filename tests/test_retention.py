"""Keep only what unlearning needs: which stored shard models stay."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from history.retention import needed_models, plan_start


def test_se_keeps_the_model_before_each_first_round_fe_only_w0():
    rounds = [1, 2, 3, 4, 5, 6]
    # clients first took part in rounds 1, 2 and 5
    # (and W^5: a client first taking part later starts there if round 7 is empty)
    assert needed_models(rounds, [1, 2, 5], last=6, interval=1) == {0, 1, 4, 5, 6}
    # dt = 2: plan rounds 1, 3, 5; g0 = 2 -> p = 1, g0 = 5 -> p = 5
    assert needed_models(rounds, [1, 2, 5], last=6, interval=2) == {0, 4, 6}
    # pruned at round 4, then round 5 brings no update and a client first takes
    # part in round 6: its replay starts at plan round 3, from W^2
    assert needed_models([1, 2, 3, 4], [1, 2], last=4, interval=2) == {0, 2, 4}
    assert needed_models(rounds, [1, 2, 5], last=6, interval=None) == {0, 6}


def _first(participation):
    first: dict[int, int] = {}
    for g, who in enumerate(participation, 1):
        for p in who:
            first.setdefault(p, g)
    return first


def _kept(participation, interval):
    rounds = [g for g, who in enumerate(participation, 1) if who]
    return needed_models(rounds, _first(participation).values(),
                         last=len(participation), interval=interval)


@settings(max_examples=300, deadline=None)
@given(participation=st.lists(st.sets(st.integers(0, 7), min_size=0, max_size=4),
                              min_size=1, max_size=12),
       interval=st.integers(1, 4), cut=st.integers(1, 12),
       forget=st.sets(st.integers(0, 7), min_size=1, max_size=3))
def test_every_replay_start_is_kept(participation, interval, cut, forget):
    """For any history and forget set, SE's W^(p-1) is kept, also when the models
    were pruned at an earlier round ``cut`` (a staged run prunes after each stage)."""
    cut = min(cut, len(participation))
    rounds = [g for g, who in enumerate(participation, 1) if who]
    first = _first(participation)
    g0 = min((first[p] for p in forget if p in first), default=None)
    start = plan_start(rounds, g0, interval) if g0 is not None else None
    if start is None:
        return
    assert start - 1 in _kept(participation, interval)
    if start - 1 <= cut:  # it existed when the prefix was pruned: it must have stayed
        assert start - 1 in _kept(participation[:cut], interval)

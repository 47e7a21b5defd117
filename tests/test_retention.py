"""Keep only what unlearning needs: which stored shard models stay."""

from __future__ import annotations

import numpy as np
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


def test_coded_estimate_of_uncoded_se_counts_what_pruning_keeps(tmp_path):
    """The coded run's SE_uncoded bytes equal an uncoded store's after pruning."""
    from conftest import InProcessGrid, set_task_identity

    from client_app.app import app as client_app
    from history import CodedRecorder, HistoryStore
    from server_app.rounds.federation import Federation

    set_task_identity()
    node_of = {p: 1000 + p for p in range(6)}
    federation = Federation(node_of, [[0, 1, 2], [3, 4, 5]])
    coded = CodedRecorder.create(tmp_path / "coded", federation, blocks_per_shard=2)
    plain = HistoryStore.create(tmp_path / "plain", federation.shard_of, num_shards=2)
    grid, rng = InProcessGrid(client_app, 6, {}), np.random.default_rng(3)
    # shard s: client 3s in rounds 1-4, 3s+1 from round 3 on; 3s+2 never
    for rnd in range(5):
        for s in range(2):
            for pid in [3 * s] * (rnd >= 1) + [3 * s + 1] * (rnd >= 3):
                update = {"w": rng.normal(size=(50,)).astype(np.float32)}
                for store in (coded, plain):
                    store.put_update(s, rnd, pid, update, 10, 0.1)
            model = {"w": rng.normal(size=(50,)).astype(np.float32)}
            for store in (coded, plain):
                store.put_shard_model(s, rnd, model)
        coded.end_round(rnd, grid)
    every = plain.total_bytes() - plain.catalog_bytes()  # blobs before pruning
    freed = plain.prune_models(1)  # keeps W^0, W^2 (before round 3), W^4
    coded.mark_complete()
    assert int(coded.meta("uncoded_bytes")) == every
    assert freed > 0 and coded.uncoded_needed_bytes(1) == every - freed
    assert coded.uncoded_needed_bytes(None) < every - freed  # FedEraser: W^0, W^4

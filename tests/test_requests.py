import pytest

from server_app.unlearning.requests import (
    RequestError,
    expected_cost,
    generate_requests,
    validate_requests,
)

SHARDS = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]


def test_even_spreads_over_shards_and_adapt_stays_in_one():
    even = generate_requests(SHARDS, 4, 1, "even", seed=1)
    shard_of = {p: s for s, ps in enumerate(SHARDS) for p in ps}
    assert sorted(shard_of[r[0]] for r in even) == [0, 1, 2, 3]
    adapt = generate_requests(SHARDS, 2, 1, "adapt", seed=1)
    assert len({shard_of[r[0]] for r in adapt}) == 1
    assert generate_requests(SHARDS, 4, 1, "even", seed=1) == even  # seeded


def test_adapt_cannot_empty_a_shard():
    with pytest.raises(RequestError, match="every remaining client of its shard.*"
                       "largest of the 4 shards has 3"):
        generate_requests(SHARDS, 3, 1, "adapt", seed=0)


@pytest.mark.parametrize("requests, words", [
    ([[99]], "unknown partition id"),
    ([[1, 1]], "twice"),
    ([[]], "names no client"),
    ([[0, 1, 2]], "every client of shard 0"),
    ([[0, 1], [2]], "every client of shard 0"),
])
def test_bad_requests(requests, words):
    with pytest.raises(RequestError, match=words):
        validate_requests(requests, SHARDS)


def test_already_forgotten_is_a_recorded_noop():
    kept, noops = validate_requests([[4], [4, 5]], SHARDS, already_forgotten=[7])
    assert kept == [[4], [5]]
    assert noops == [{"request": 1, "client": 4, "reason": "already forgotten"}]
    kept, noops = validate_requests([[7]], SHARDS, already_forgotten=[7])
    assert kept == [[]] and noops[0]["client"] == 7


def test_expected_costs():
    assert expected_cost("sequential", 4, 4, 2.0) == 8.0
    assert expected_cost("concurrent", 1, 4, 2.0) == pytest.approx(2.0)
    assert expected_cost("concurrent", 4, 4, 1.0) == pytest.approx(4 * (1 - 0.75 ** 4))

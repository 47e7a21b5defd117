"""A command's own defaults always run (issue 29 item 2).

Every ``deploy N`` (N = 2..8) and every preset, through ``run`` and through
``deploy N``, is planned as the command would plan it (the merged run config,
then the pre-engine checks with the dataset loaded: requests, shards, partition);
no engine starts. Generated requests go to a shard that can serve them.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli import config
from cli.deploy import deploy_config, preset_clients
from server_app.config import ConfigError
from server_app.preflight import validate_run_config
from server_app.rounds.federation import assign_shards
from server_app.unlearning.plan import plan_requests
from server_app.unlearning.requests import (
    RequestError,
    generate_requests,
    validate_requests,
)

PRESETS = sorted(p.stem for p in config.PRESETS.glob("*.toml"))
_TASKS: dict = {}


def _task(dataset: str, data_dir):
    """The loaded dataset (cached over the module: loading is the slow part)."""
    from task.builtin import load_task_data

    if dataset not in _TASKS:
        _TASKS[dataset] = load_task_data(dataset, str(data_dir), 64)
    return _TASKS[dataset]


def _preset_key(preset: str | None) -> str:
    """The preset's request key: ``forget-records`` if it sets one, else clients."""
    values = config.parse_item(str(config.preset_path(preset))) if preset else {}
    return "forget-records" if values.get("forget-records") else "forget-clients"


def _preset_forgets(preset: str | None) -> list[int]:
    if preset is None:
        return []
    key = _preset_key(preset)
    return preset_clients(key, config.parse_item(str(config.preset_path(preset))).get(key))


def _plan(merged: config.Merged, data_dir) -> list[list[int]]:
    """The checks the command runs before any engine, then the planned requests."""
    cfg = validate_run_config(merged.config, _task(merged.config["dataset"], data_dir),
                              files=False)
    return plan_requests(cfg)[0]


@pytest.mark.parametrize("nodes", range(2, 9))
@pytest.mark.parametrize("preset", [None, *PRESETS])
@pytest.mark.parametrize("partition", [None, "noniid"])
def test_every_deploy_n_and_preset_plans(nodes, preset, partition, shared_data):
    items = [f"partition='{partition}'"] if partition else []
    forgets = _preset_forgets(preset)
    if forgets and max(forgets) >= nodes:  # a preset naming clients deploy N has not
        with pytest.raises(ConfigError) as err:
            deploy_config(nodes, preset, items)
        message = str(err.value)
        assert f"N >= {max(forgets) + 1}" in message and _preset_key(preset) in message
        assert "\n" not in message
        return
    merged = deploy_config(nodes, preset, items)
    requests = _plan(merged, shared_data)
    if _preset_key(preset) == "forget-records":  # the clients stay: no client request
        assert merged.config["num-clients"] == nodes and requests == []
        return
    assert merged.config["num-clients"] == nodes and len(requests) == 1
    assert requests == [forgets] if forgets else len(requests[0]) == 1
    shards = assign_shards(nodes, merged.config["num-shards"], merged.config["seed"])
    validate_requests(requests, shards)  # no shard loses its last client


@pytest.mark.parametrize("preset", [None, *PRESETS])
def test_run_with_each_preset_plans(preset, shared_data):
    requests = _plan(config.resolve(preset), shared_data)
    forgets = _preset_forgets(preset)
    if _preset_key(preset) == "forget-records":  # the clients stay: no client request
        assert requests == [] and forgets
        return
    assert requests == [forgets] if forgets else len(requests) == 1


def test_deploy_3_noniid_forgets_a_client_of_the_two_client_shard(shared_data):
    """The issue's case: the seeded shard has one client, the other two."""
    merged = deploy_config(3, None, ["partition='noniid'"])
    shards = assign_shards(3, 2, 0)
    (request,) = _plan(merged, shared_data)
    big = next(s for s in shards if len(s) == 2)
    assert len(request) == 1 and request[0] in big


def test_deploy_shrinks_shards_so_one_can_serve_a_request():
    assert deploy_config(2, None, []).config["num-shards"] == 1
    assert deploy_config(4, "paper", []).config["num-shards"] == 3  # 4 of one client
    assert deploy_config(5, "paper", []).config["num-shards"] == 4  # 2,1,1,1 serves
    # an explicit value is kept, and refused with what the user can change
    merged = deploy_config(4, None, ["num-shards=4"])
    with pytest.raises(ConfigError, match="'num-shards' = 4 .* at most 3 with 4 clients"
                       ".*fewer shards, more clients or frameworks"):
        validate_run_config(merged.config, files=False)


@pytest.mark.parametrize("overrides, words", [
    ({"num-clients": 4, "num-shards": 4, "clients-per-round": 4},
     ["'num-shards' = 4", "at most 3", "frameworks = 'none'"]),
    ({"num-clients": 1, "num-shards": 1, "clients-per-round": 1},
     ["'num-clients' = 1", "at least 2", "frameworks = 'none'"]),
    ({"num-clients": 8, "num-shards": 2, "clients-per-round": 4, "clients-per-request": 4},
     ["'clients-per-request' = 4", "at most 3", "has 4 clients"]),
])
def test_a_request_that_cannot_be_drawn_names_what_can_change(overrides, words):
    with pytest.raises(ConfigError) as err:
        validate_run_config(overrides, files=False)
    for word in words:
        assert word in str(err.value), str(err.value)


# ---- the generator: a shard that can serve it; unchanged draws otherwise ----------
def _seeded_only(shards, k, per, distribution, seed):
    """The draw with every request on its seeded shard, or None if one cannot serve."""
    rng = np.random.default_rng(seed)
    pools = [list(rng.permutation(list(p))) for p in shards]
    first = int(rng.integers(len(shards)))
    out = []
    for i in range(k):
        s = (first + i) % len(shards) if distribution == "even" else first
        if len(pools[s]) <= per:
            return None
        out.append(sorted(int(pools[s].pop()) for _ in range(per)))
    return out


@settings(max_examples=300, deadline=None)
@given(clients=st.integers(1, 30), shards=st.integers(1, 8), k=st.integers(1, 5),
       per=st.integers(1, 3), distribution=st.sampled_from(["even", "adapt"]),
       seed=st.integers(0, 2**32 - 1))
def test_generated_requests_keep_seeded_draws_and_serve_when_any_shard_can(
        clients, shards, k, per, distribution, seed):
    parts = assign_shards(clients, min(shards, clients), seed)
    expected = _seeded_only(parts, k, per, distribution, seed)
    sizes = sorted(map(len, parts), reverse=True)
    if distribution == "adapt":
        servable = sizes[0] > k * per
    else:  # greedy over the shards: each can give (size - 1) // per requests
        servable = sum((n - 1) // per for n in sizes) >= k
    try:
        drawn = generate_requests(parts, k, per, distribution, seed)
    except RequestError:
        assert expected is None and not servable
        return
    if expected is not None:
        assert drawn == expected  # a draw its seeded shards could serve is unchanged
    validate_requests(drawn, parts)
    shard_of = {p: s for s, ps in enumerate(parts) for p in ps}
    assert all(len({shard_of[p] for p in r}) == 1 and len(r) == per for r in drawn)
    if distribution == "adapt":
        assert len({shard_of[r[0]] for r in drawn}) == 1

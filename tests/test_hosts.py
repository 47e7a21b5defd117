"""Separate network hosts: the product across a LAN with TLS and SuperNode keys.

One federation for the module (:class:`cli.hosts.Federation`): a SuperLink host
and four SuperNode hosts, each a network namespace with its own address, TLS
with a certificate naming ``superlink.se.test``, SuperNode keys registered with
``flwr supernode register``, plus one spare host for the security checks. One
learning run (coded storage, SE and FR, a request to forget client 1) is shared
by the checks that read its results. Needs root and ``ip`` (skips otherwise).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli import config as cli_config
from cli import netns, pki
from cli.procs import Children

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
NODES = 4
CONFIG = {"num-clients": NODES, "num-shards": 2, "clients-per-round": 4, "num-rounds": 2,
          "local-epochs": 1, "client-samples": 64, "test-samples": 200, "mia": False,
          "frameworks": "SE,FR", "storage": "coded", "forget-clients": "1", "seed": 0}
RUN_TIMEOUT_S = 400

pytestmark = [pytest.mark.hosts, pytest.mark.e2e]


def _items(values: dict) -> str:
    return " ".join(f"{k}={json.dumps(v) if isinstance(v, str) else str(v).lower()}"
                    if isinstance(v, bool) else f"{k}={json.dumps(v)}"
                    for k, v in values.items())


@pytest.fixture(scope="module")
def fed(tmp_path_factory, shared_data):
    """The federation: SuperLink host, 4 SuperNode hosts, 1 spare host."""
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    from cli.hosts import Federation

    root = tmp_path_factory.mktemp("hosts")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLWR_HOME", str(root / "flwr_home"))
        mp.setenv("SE_RESULTS_DIR", str(root / "results"))
        mp.setenv("SE_DATA_DIR", str(shared_data))
        mp.setenv("FLWR_TELEMETRY_ENABLED", "0")
        mp.setenv("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
        mp.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
        run_dir = root / "run"
        for sub in ("logs", "nodes"):
            (run_dir / sub).mkdir(parents=True)
        with Children() as children, Federation(
                run_dir, NODES, children, slots=2, nice=5, spare=1) as federation:
            federation.start()
            yield federation


def run_on(fed, values: dict, name: str) -> dict:
    """One ``flwr run`` on the federation; its summary.json (asserts it was written)."""
    path = fed.run_dir / f"{name}.toml"
    path.write_text(cli_config.to_toml({**values, "run-name": name}))
    log = fed.run_dir / "logs" / f"{name}.log"
    summary = fed.run(path, log, RUN_TIMEOUT_S)
    assert summary is not None, log.read_text(errors="replace")[-3000:]
    return json.loads(summary.read_text())


@pytest.fixture(scope="module")
def learned(fed):
    """The shared run: learn, forget client 1 with SE and FR, coded storage."""
    start = time.monotonic()
    summary = run_on(fed, CONFIG, "hosts")
    summary["_wall_s"] = time.monotonic() - start
    return summary


def test_learn_forget_coded_across_hosts(fed, learned):
    assert learned["config"]["num-clients"] == NODES
    assert learned["storage"]["mode"] == "coded"
    assert 0.0 <= learned["learning"]["accuracy"] <= 1.0
    assert [r["participants"] for r in learned["learning"]["rounds"]] == [4, 4]
    assert learned["unlearning"]["requests"] == [[1]]
    se = learned["frameworks"]["SE"]["requests"][0]
    assert se["clients"] == [1]
    # SE rebuilt the impacted shard's history from slices fetched from the hosts
    shards = se["slice_retrieval"]["shards"]
    assert shards and all(s["holders"] == NODES and s["lost"] == 0 for s in shards)
    assert "FR" in learned["frameworks"]
    # each SuperNode host holds its slices in its own node-dir
    for i in range(NODES):
        assert list((fed.run_dir / "nodes" / str(i) / "slices").rglob("round-*.npz"))
    # the SuperLink saw each SuperNode from its own address, over TLS, by name
    link_log = (fed.run_dir / "logs" / "superlink.log").read_text(errors="replace")
    assert "Uvicorn running on https://10.231.0.1:9093" in link_log
    seen = set(re.findall(r"(10\.231\.0\.\d+):\d+ - \"POST /v1/fleet/", link_log))
    assert {h.address for h in fed.hosts} <= seen
    for i in range(NODES):
        assert f"--superlink {fed.address}" in " ".join(fed.supernodes[i].args)


def test_same_results_as_loopback(fed, learned, tmp_path):
    env = {**os.environ, "SE_RESULTS_DIR": str(tmp_path / "results"),
           "SE_DEPLOY_DIR": str(tmp_path / "runs"), "SE_DEPLOY_TIMEOUT": "400"}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "deploy.sh"), str(NODES), "--run-config",
         _items({**CONFIG, "run-name": "loopback"}), "--control-nice", "5"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    loop = json.loads((tmp_path / "results" / "loopback" / "summary.json").read_text())
    for key in ("accuracy", "shard_accuracy"):
        assert loop["learning"][key] == learned["learning"][key]
    assert loop["learning"]["loss"] == pytest.approx(learned["learning"]["loss"], 1e-6)
    for name in ("SE", "FR"):
        assert loop["frameworks"][name]["accuracy"] == \
            learned["frameworks"][name]["accuracy"]
        assert loop["frameworks"][name]["shard_accuracy"] == \
            learned["frameworks"][name]["shard_accuracy"]


# --- security across the network --------------------------------------------------


def _spare_node(fed, security: list[str], name: str, seconds: float = 30.0):
    """A SuperNode on the spare host; (exit status or None if still running, log)."""
    log = fed.run_dir / "logs" / f"spare-{name}.log"
    with open(log, "wb") as out:
        proc = fed.children.start(
            [*fed.spares[0].wrap(), "flower-supernode", *security, "--superlink",
             fed.address, "--max-retries", "1", "--max-wait-time", "10",
             "--node-config", "partition-id=9 num-partitions=10",
             "--isolation", "subprocess"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        status = proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        status = None
    return status, proc, log.read_text(errors="replace")


def test_unregistered_key_is_refused(fed, learned):
    key = pki.node_key(fed.pki_dir / "stranger.key")
    before = fed.listed_nodes()
    status, _, log = _spare_node(fed, ["--root-certificates", str(fed.ca.cert),
                                       "--auth-supernode-private-key", str(key.key)],
                                 "unregistered")
    assert status not in (0, None), log[-2000:]
    assert "Failed to activate SuperNode" in log
    assert fed.listed_nodes() == before


def test_other_ca_and_plain_http_fail_to_connect(fed, learned):
    key = pki.node_key(fed.pki_dir / "spare-tls.key")
    node_id = fed.register(key.cert)
    other = pki.make_ca(fed.pki_dir / "other", "other-ca")
    status, _, log = _spare_node(fed, ["--root-certificates", str(other.cert),
                                       "--auth-supernode-private-key", str(key.key)],
                                 "other-ca")
    assert status not in (0, None), log[-2000:]
    assert "CERTIFICATE_VERIFY_FAILED" in log
    # without TLS: Flower refuses a key over plain HTTP itself; without the key the
    # SuperLink (TLS only) does not answer plain HTTP
    status, _, log = _spare_node(fed, ["--insecure", "--auth-supernode-private-key",
                                       str(key.key)], "insecure-key")
    assert status not in (0, None) and "TLS is not enabled" in log, log[-2000:]
    status, _, log = _spare_node(fed, ["--insecure"], "insecure")
    assert status not in (0, None), log[-2000:]
    assert "could not establish a connection" in log
    assert fed.listed_nodes()[node_id] == "registered"  # never came online
    fed.unregister(node_id)


def test_node_unregistered_gets_no_messages(fed, learned):
    key = pki.node_key(fed.pki_dir / "spare-unreg.key")
    node_id = fed.register(key.cert)
    log = fed.run_dir / "logs" / "spare-unreg.log"
    with open(log, "wb") as out:
        proc = fed.children.start(
            [*fed.spares[0].wrap(), "flower-supernode", "--root-certificates",
             str(fed.ca.cert), "--auth-supernode-private-key", str(key.key),
             "--superlink", fed.address, "--node-config",
             "partition-id=9 num-partitions=10", "--isolation", "subprocess"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    from cli.hosts import wait_until

    assert wait_until(lambda: fed.listed_nodes().get(node_id) == "online", 30)
    fed.unregister(node_id)
    # the SuperLink refuses its next call; the SuperNode ends by itself
    assert proc.wait(timeout=30) is not None
    assert fed.listed_nodes()[node_id] == "unregistered"
    probe = _probe(fed, fed.spares[0], key.key, node_id)
    assert probe == "refused 401", probe


# --- one node cannot fetch another node's coded slices -----------------------------


def _probe(fed, host, key: Path, node_id: int) -> str:
    """A signed Fleet PullMessages from ``host`` claiming ``node_id`` (hosts_probe.py)."""
    proc = subprocess.run([*host.wrap(), sys.executable,
                           str(ROOT / "tests" / "hosts_probe.py"), str(key),
                           str(fed.ca.cert), fed.address, str(node_id)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    return (proc.stdout.strip().splitlines() or [proc.stderr[-500:]])[-1]


def test_node_cannot_fetch_another_nodes_slices(fed, learned):
    # over the network: node 0's key, claiming node 1's id, is refused by the
    # SuperLink (messages for node 1, slices included, reach node 1 only)
    assert _probe(fed, fed.hosts[0], fed.keys[0].key, fed.node_ids[1]) == "refused 401"
    assert _probe(fed, fed.hosts[0], fed.keys[0].key, fed.node_ids[0]) == "ok 0"
    # and at node 1 itself: a fetch proven with node 0's access keys is refused,
    # one with node 1's own is served (the run's real slice files)
    from flwr.app import ConfigRecord, Context, RecordDict

    from coding import key_proof
    from history import slices
    from history.slice_files import SliceFolder

    store = next((fed.run_dir / "nodes" / "1" / "slices").iterdir()).name

    def fetch(holder: int, prover: int):
        access = SliceFolder(fed.run_dir / "nodes" / str(prover) / "slices" / store
                             ).read_access()
        nonce = secrets.token_bytes(16)
        _, keys = access
        request = ConfigRecord({"store": store, "shard": 0, "rounds": [1],
                                "nonce": nonce, "proof": key_proof(keys[0], nonce)})
        context = Context(run_id=1, node_id=holder, state=RecordDict(), run_config={},
                          node_config={"partition-id": holder, "node-dir": str(
                              fed.run_dir / "nodes" / str(holder))})
        return slices.fetch(RecordDict({"request": request}), context)

    with pytest.raises(slices.SliceAccessError):
        fetch(holder=1, prover=0)
    assert fetch(holder=1, prover=1).config_records["info"]["held"] == 1

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
from conftest import DEPLOYED

from cli import config as cli_config
from cli import netns, pki
from cli.procs import Children

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
NODES = DEPLOYED["num-clients"]
CONFIG = DEPLOYED  # the loopback deployment's run (conftest.loopback_deploy)
RUN_TIMEOUT_S = 400

pytestmark = [pytest.mark.hosts, pytest.mark.e2e]  # one worker (conftest.shared_unit)


@pytest.fixture(scope="module")
def fed(tmp_path_factory, shared_data):
    """The federation: SuperLink host, 4 SuperNode hosts, 1 spare host."""
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)
    from cli.deploy_parts import SuperNodeOptions
    from cli.hosts import Federation

    root = tmp_path_factory.mktemp("hosts")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLWR_HOME", str(root / "flwr_home"))
        mp.setenv("SE_RESULTS_DIR", str(root / "results"))
        mp.setenv("SE_DATA_DIR", str(shared_data))
        mp.setenv("FLWR_TELEMETRY_ENABLED", "0")
        mp.setenv("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
        # a dead SuperNode is offline for the SuperLink after 2 x 10 s, not 2 x 30 s
        mp.setenv("SE_NODE_HEARTBEAT_S", "10")
        mp.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
        run_dir = root / "run"
        for sub in ("logs", "nodes"):
            (run_dir / sub).mkdir(parents=True)
        with Children() as children, Federation(
                run_dir, NODES, children, options=SuperNodeOptions(nice=5), slots=2,
                spare=1, database=True) as federation:
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


def test_same_results_as_loopback(fed, learned, loopback_deploy):
    proc, root = loopback_deploy
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    loop = json.loads((root / "results" / "loopback" / "summary.json").read_text())
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
    from history.coded import slices
    from history.coded.slice_files import SliceFolder

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


# --- network faults -----------------------------------------------------------------


def _watch(log: Path, steps: list, seconds: float = RUN_TIMEOUT_S):
    """A thread that runs ``action()`` once ``pattern`` is in ``log``, step by step."""
    import threading

    done: list[str] = []

    def body() -> None:
        deadline = time.monotonic() + seconds
        for pattern, action in steps:
            while time.monotonic() < deadline:
                text = log.read_text(errors="replace") if log.exists() else ""
                if re.search(pattern, text):
                    action()
                    done.append(pattern)
                    break
                time.sleep(0.2)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, done


# one shard of 4 clients: three requests can each forget one (3 now, then 0 and 1)
FAULTS = {**CONFIG, "num-shards": 1, "num-rounds": 4, "frameworks": "SE",
          "forget-clients": "3", "round-timeout": 20.0}


@pytest.fixture(scope="module")
def link_fault(fed):
    """Run "faults": SuperNode host 2's link down during round 2, up after it.

    Round 3 starts at once, before the SuperNode has reconnected (its retries
    back off): it may miss round 3 too; it is back for round 4.
    """
    host = fed.hosts[2]
    log = fed.run_dir / "logs" / "faults.log"
    times: dict = {}

    def down():
        times["down"] = time.monotonic()
        host.link(False)

    def up():
        times["up"] = time.monotonic()
        host.link(True)

    thread, done = _watch(log, [(r"sharded round 1/4", down), (r"sharded round 2/4", up)])
    stores = set((fed.run_dir / "nodes" / "0" / "slices").iterdir())
    try:
        summary = run_on(fed, FAULTS, "faults")
    finally:
        host.link(True)
    thread.join(timeout=5)
    (store,) = set((fed.run_dir / "nodes" / "0" / "slices").iterdir()) - stores
    return summary, done, times, store.name


def test_link_down_mid_round(fed, link_fault):
    summary, done, times, store = link_fault
    assert len(done) == 2, done
    rounds = summary["learning"]["rounds"]
    participants = [r["participants"] for r in rounds]
    assert participants[:2] == [4, 3], participants
    # the round went on without host 2 within round-timeout, and said so
    assert times["up"] - times["down"] < 3 * FAULTS["round-timeout"] + 30
    faults = summary["faults"]["entries"]
    # host 2 is missing from round 2 on: no answer within round-timeout, or, once
    # it missed two heartbeats, the SuperLink's own "unreachable" answer for it
    assert any(f["round"] == 2 for f in faults), faults
    # every fault is host 2's missing answer (none misread as another node's reply)
    assert all(f["partition"] == 2 and f["kind"] == "dropout" for f in faults), faults
    assert all("round timeout" in f["reason"] or "unreachable" in f["reason"]
               for f in faults), faults
    # round 2's slice never reached it; it comes back (its heartbeats back off up
    # to 20 s while the link is down) and serves its slices: the next test's
    # request decodes from all 4 holders
    node2 = fed.run_dir / "nodes" / "2" / "slices" / store
    held = sorted(p.name for p in node2.glob("round-*.npz"))
    assert "round-1.npz" in held and "round-2.npz" not in held, held
    assert fed.wait_online(90)
    (shard,) = summary["frameworks"]["SE"]["requests"][0]["slice_retrieval"]["shards"]
    assert shard["holders"] == NODES and shard["lost"] == 0


def _later(fed, name: str, clients: str) -> tuple[str, Path, Path]:
    """Record a request to forget ``clients`` in run ``name``; carry it out there.

    Returns the request id, the run folder and the log (a later-requests run
    writes receipts, no summary.json).
    """
    from cli.forget import submit
    from cli.runs import open_inbox, run_folder

    results = os.environ["SE_RESULTS_DIR"]
    request = submit(name, clients, results)
    folder = run_folder(name, results)
    with open_inbox(folder) as inbox:
        settings = inbox.settings()
    path = fed.run_dir / f"{name}-{request}.toml"
    path.write_text(cli_config.to_toml({**settings, "later-requests": True}))
    log = fed.run_dir / "logs" / f"{name}-{request}.log"
    fed.run(path, log, RUN_TIMEOUT_S)
    return request, folder, log


def _receipt(folder: Path, request: str) -> dict:
    return json.loads((folder / "receipts" / f"{request}.json").read_text())


def test_host_killed_and_restarted_keeps_its_slices(fed, link_fault):
    before = sorted(p.read_bytes() for p in
                    (fed.run_dir / "nodes" / "1" / "slices").rglob("round-*.npz"))
    assert fed.kill_host(1)
    assert not netns.namespace_pids(fed.hosts[1].netns)
    fed.restart_node(1)  # once the SuperLink has taken the dead one as offline
    assert fed.wait_online(60)
    after = sorted(p.read_bytes() for p in
                   (fed.run_dir / "nodes" / "1" / "slices").rglob("round-*.npz"))
    assert after == before  # the crash lost nothing of its node-dir
    request, folder, log = _later(fed, "faults", "0")
    receipt = _receipt(folder, request)
    assert receipt["status"] == "done", receipt
    text = log.read_text(errors="replace")
    # all 4 holders answered: host 1 (restarted) and host 2 (its link back up)
    assert re.search(r"coded history of shard 0: \d+ rounds decoded from 4 holders "
                     r"\(0 absent", text), text[-3000:]


def test_superlink_killed_and_restarted(fed, learned):
    import sqlite3

    from cli.runs import open_inbox

    folder = Path(os.environ["SE_RESULTS_DIR"]) / "hosts"
    versions = sorted(p.name for p in (folder / "models").iterdir())
    log = fed.run_dir / "logs" / "killed-link.log"
    # a later request under way when the SuperLink host dies (ServerApp with it)
    thread, done = _watch(log, [(r"Start `flwr-serverapp` process",
                                 lambda: (time.sleep(4), fed.kill_link()))])
    from cli.forget import submit

    request = submit("hosts", "0", os.environ["SE_RESULTS_DIR"])
    path = fed.run_dir / "killed-link.toml"
    with open_inbox(folder) as inbox:
        settings = inbox.settings()
    path.write_text(cli_config.to_toml({**settings, "later-requests": True}))
    assert fed.run(path, log, RUN_TIMEOUT_S) is None
    thread.join(timeout=5)
    assert done, log.read_text(errors="replace")[-2000:]
    assert "summary: " not in log.read_text(errors="replace")
    # nothing stored was lost or half-written: the request still waits, the
    # catalog is intact, no model version was added
    with open_inbox(folder) as inbox:
        assert request in [r.id for r in inbox.pending()]
    check = sqlite3.connect(folder / "run.sqlite").execute("PRAGMA integrity_check")
    assert check.fetchone()[0] == "ok"
    assert sorted(p.name for p in (folder / "models").iterdir()) == versions
    # restarted on its database: the registered nodes come back, the request is done
    fed.start_link()
    assert fed.wait_online(90)
    relog = fed.run_dir / "logs" / "relink.log"
    assert fed.run(path, relog, RUN_TIMEOUT_S) is not None or \
        (folder / "receipts" / f"{request}.json").exists(), relog.read_text()[-3000:]
    assert _receipt(folder, request)["status"] == "done"


def _forget_on_link(fed, *args: str) -> subprocess.CompletedProcess:
    """``python -m cli forget ARGS`` on the SuperLink host, as an operator runs it."""
    return subprocess.run([*fed.link.wrap(), sys.executable, "-m", "cli", "forget",
                           *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          stdin=subprocess.DEVNULL, cwd=ROOT)


@pytest.fixture(scope="module")
def own_fed(fed, tmp_path_factory, shared_data):
    """A second federation whose SuperNode hosts each see only their own client folder.

    ``cli client-data`` writes one folder per client; on SuperNode host i a mount
    namespace shows client i's folder alone: the folders' root and the dataset are
    empty there. The SuperLink host keeps the dataset folder, of which the run
    (``client-data = true``) reads only the test split.
    """
    from cli.deploy_parts import Place, SuperNodeOptions
    from cli.hosts import Federation

    root = tmp_path_factory.mktemp("own")
    folders, own = root / "client-data", root / "own"
    made = subprocess.run(
        [sys.executable, "-m", "cli", "client-data", "--out", str(folders),
         "--run-config", cli_config.describe(OWN_RUN)], cwd=ROOT, capture_output=True,
        text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    hidden = " && ".join(f"mount -t tmpfs none {p}" for p in (folders, shared_data))

    class OwnDataOnly(Federation):
        def node_place(self, i: int) -> Place:
            place = super().node_place(i)
            script = (f"mount --bind {folders}/client-{i} {own}/{i} && {hidden} && "
                      'exec "$@"')
            return Place(place.host, (*place.wrap, "unshare", "-m", "--propagation",
                                      "private", "sh", "-c", script, "sh"),
                         place.security, place.connect)

    for i in range(NODES):
        (own / str(i)).mkdir(parents=True)
    run_dir = root / "run"
    for sub in ("logs", "nodes"):
        (run_dir / sub).mkdir(parents=True)
    with Children() as children, OwnDataOnly(
            run_dir, NODES, children, options=SuperNodeOptions(nice=5), slots=2,
            client_data=[own / str(i) for i in range(NODES)]) as federation:
        federation.start()
        yield federation


OWN_RUN = {**CONFIG, "storage": "uncoded", "forget-clients": "", "frameworks": "none",
           "client-data": True}
"""Every client reads its own folder; the ServerApp reads only the test split."""


def test_a_later_request_is_carried_out_by_the_runs_own_supernodes(own_fed):
    """Learned with ``flwr run . <federation>``, forgotten with ``forget --run R``.

    Every SuperNode host sees only its own client's folder; the ServerApp reads only
    the test split. ``forget`` on the run
    goes back to its federation: the live SuperNodes train (their logs show the
    messages), the receipt names the engine, the federation and the partitions that
    trained; with the SuperLink down the next request stays pending, exit 1.
    """
    from cli.runs import open_inbox

    fed = own_fed
    summary = run_on(fed, OWN_RUN, "live")
    assert [r["participants"] for r in summary["learning"]["rounds"]] == [4, 4]
    folder = Path(os.environ["SE_RESULTS_DIR"]) / "live"
    logs = [fed.run_dir / "logs" / f"supernode-{i}.log" for i in range(NODES)]
    sizes = [p.stat().st_size for p in logs]
    done = _forget_on_link(fed, "--run", "live", "--clients", "2")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert f"federation {fed.connection_name!r}" in done.stderr
    with open_inbox(folder) as inbox:
        (receipt,) = inbox.receipts()
        assert [v.version for v in inbox.versions()] == [1, 2]
    assert receipt["status"] == "done"
    engine = receipt["engine"]
    assert engine["kind"] == "deployment" and engine["federation"] == fed.connection_name
    assert engine["trained"] and 2 not in engine["trained"]
    for p in engine["trained"]:  # the request's messages reached those SuperNodes
        grown = logs[p].read_bytes()[sizes[p]:].decode(errors="replace")
        assert "train" in grown, (p, grown[-1500:])
    fed.kill_link()
    try:
        down = _forget_on_link(fed, "--run", "live", "--clients", "3")
        lines = down.stderr.strip().splitlines()
        assert down.returncode == 1, down.stdout + down.stderr
        assert "cannot be reached" in lines[-1] and "pending" in lines[-1], lines
        with open_inbox(folder) as inbox:
            assert [r.clients for r in inbox.pending()] == [[3]]
            assert [v.version for v in inbox.versions()] == [1, 2]
    finally:
        fed.start_link()


def test_more_hosts_lost_than_the_budget(fed, learned):
    import shutil

    lost = [1, 2, 3]  # 3 of 4 slices of every round; the budget is 2 (0.5 x 4)
    for i in lost:
        fed.kill_host(i)
        shutil.rmtree(fed.run_dir / "nodes" / str(i) / "slices")
    for i in lost:
        fed.restart_node(i)
    assert fed.wait_online(60)
    start = time.monotonic()
    request, folder, log = _later(fed, "faults", "1")
    text = log.read_text(errors="replace")
    assert time.monotonic() - start < 200  # an error, not a hang
    line = next((x for x in text.splitlines() if "cannot recover round" in x), "")
    assert "of shard 0" in line and "slices missing: partitions [1, 2, 3]" in line, \
        text[-3000:]
    # nothing was changed: the request was not carried out, no version was added
    from cli.runs import open_inbox

    with open_inbox(folder) as inbox:
        assert request not in [r.id for r in inbox.all() if r.state == "done"]
    assert not (folder / "receipts" / f"{request}.json").exists() or \
        _receipt(folder, request)["status"] != "done"

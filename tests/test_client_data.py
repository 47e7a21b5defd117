"""Each client with only its own data (issue 54, item 2).

The per-client folder format round-trips and refuses damage; the ``client-data``
command writes one folder per partition and refuses bad input in one line; a run
whose every client reads its own folder (node-config ``client-data``) is the run
that cuts the partition, bit for bit; a node whose folder is another partition's
or damaged answers with a one-line error, at discovery and in training.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from task.client_folder import (
    ARRAYS,
    MANIFEST,
    ClientDataError,
    Manifest,
    check_against_run,
    digest,
    load_own_data,
    read_client_folder,
    write_client_folder,
)

RNG = np.random.default_rng(0)
X = RNG.integers(0, 256, size=(12, 1, 4, 4), dtype=np.uint8)
Y = RNG.integers(0, 10, size=12).astype(np.int64)


def _folder(tmp_path: Path, pid: int = 3, name: str = "c") -> Path:
    write_client_folder(tmp_path / name, X, Y, "mnist", pid, 10, {"seed": 0})
    return tmp_path / name


# ---- the format -------------------------------------------------------------------
def test_the_format_round_trips(tmp_path):
    written = write_client_folder(tmp_path / "c", X, Y, "mnist", 3, 10, {"seed": 0})
    x, y, manifest = read_client_folder(tmp_path / "c")
    assert manifest == written
    assert x.dtype == X.dtype and y.dtype == np.int64
    assert np.array_equal(x, X) and np.array_equal(y, Y)
    assert manifest.records == 12 and manifest.sha256 == digest(X, Y)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [MANIFEST, ARRAYS]
    raw = json.loads((tmp_path / "c" / MANIFEST).read_text())
    assert raw["format"] == "sharding-eraser/client-data" and raw["version"] == 1
    assert raw["partition-id"] == 3 and raw["x-shape"] == [12, 1, 4, 4]
    assert Manifest.from_json(manifest.to_json()) == manifest
    with np.load(tmp_path / "c" / ARRAYS, allow_pickle=False) as plain:  # plain numpy
        assert sorted(plain.files) == ["x", "y"]


def test_records_keep_their_order_and_the_cap_takes_the_first(tmp_path):
    x, y, classes = load_own_data(_folder(tmp_path), "mnist", 3, cap=5)
    assert classes == 10 and np.array_equal(x.numpy(), X[:5])
    assert np.array_equal(y.numpy(), Y[:5])


def test_an_existing_folder_is_not_overwritten(tmp_path):
    _folder(tmp_path)
    with pytest.raises(ClientDataError, match="exists already"):
        _folder(tmp_path)


def _damage_arrays(folder: Path) -> None:
    data = bytearray((folder / ARRAYS).read_bytes())
    data[-300] ^= 0xFF  # inside y's or x's bytes: the zip still reads
    (folder / ARRAYS).write_bytes(bytes(data))


def _edit_manifest(key: str, value):
    def edit(folder: Path) -> None:
        raw = json.loads((folder / MANIFEST).read_text())
        raw[key] = value
        (folder / MANIFEST).write_text(json.dumps(raw))
    return edit


@pytest.mark.parametrize("damage, words", [
    (_damage_arrays, "records.npz cannot be read (BadZipFile: Bad CRC-32"),
    (_edit_manifest("sha256", "0" * 64), "SHA-256 differs from the manifest's"),
    (lambda f: (f / ARRAYS).write_bytes(b"not a zip"), "records.npz cannot be read"),
    (lambda f: (f / ARRAYS).unlink(), "No such file"),
    (lambda f: (f / MANIFEST).write_text("{"), "is not JSON"),
    (_edit_manifest("records", 11), "differ from the manifest's 11 records"),
    (_edit_manifest("version", 2), "has version 2"),
    (_edit_manifest("format", "other"), "is not a sharding-eraser/client-data"),
    (_edit_manifest("partition-id", "3"), "'partition-id' = '3' is not a int"),
    (_edit_manifest("num-classes", 1), "num-classes = 1 must be"),
])
def test_a_damaged_folder_is_a_one_line_error(tmp_path, damage, words):
    folder = _folder(tmp_path)
    damage(folder)
    with pytest.raises(ClientDataError) as err:
        read_client_folder(folder)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_missing_folder_is_a_one_line_error(tmp_path):
    with pytest.raises(ClientDataError, match="client-data folder .*nowhere"):
        read_client_folder(tmp_path / "nowhere")


@pytest.mark.parametrize("task, pid, block, words", [
    ("fmnist", 3, None, "holds task 'mnist' data; this run's task is 'fmnist'"),
    ("mnist", 4, None, "belongs to partition-id 3; this node is partition-id 4"),
])
def test_a_folder_of_another_run_or_client_is_refused(tmp_path, task, pid, block, words):
    folder = _folder(tmp_path)
    with pytest.raises(ClientDataError, match=words):
        check_against_run(read_client_folder(folder)[2], folder, task, pid, block)


def test_text_blocks_of_another_block_size_are_refused(tmp_path):
    x = np.zeros((3, 8), np.int64)
    write_client_folder(tmp_path / "t", x, x, "shakespeare", 0, 65)
    manifest = read_client_folder(tmp_path / "t")[2]
    check_against_run(manifest, tmp_path / "t", "shakespeare", 0, 8)
    with pytest.raises(ClientDataError, match="blocks of 8 characters; this run's "
                       "block-size is 64"):
        check_against_run(manifest, tmp_path / "t", "shakespeare", 0, 64)


# ---- the server's bound -----------------------------------------------------------
def test_reported_records_replace_the_cut_sizes_capped():
    from server_app.rounds.federation import bounded_sizes

    cut = {0: 64, 1: 64, 2: 64}
    assert bounded_sizes(cut, {1: 40, 2: 500}, cap=64) == {0: 64, 1: 40, 2: 64}
    assert bounded_sizes(cut, {2: 500}, cap=0) == {0: 64, 1: 64, 2: 500}
    assert bounded_sizes({}, {0: 7}) == {0: 7}  # a server that cut nothing


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "5"])
def test_a_malformed_record_count_at_discovery_is_a_one_line_error(value):
    from experiments.grid import InProcessGrid
    from server_app.rounds.federation import DiscoveryError, find_nodes

    def client(message, context):
        pid = context.node_config["partition-id"]
        info = ConfigRecord({"partition-id": pid, "num-records": 9 if pid else value})
        return Message(RecordDict({"info": info}), reply_to=message)

    with pytest.raises(DiscoveryError) as err:
        find_nodes(InProcessGrid(client, 2, {}), 2, timeout=1)
    assert "node 1000 reports num-records" in str(err.value)
    assert "\n" not in str(err.value)


# ---- the ClientApp with its own folder --------------------------------------------
@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The ``client-data`` command's folders for the tiny run (:data:`conftest.TINY`)."""
    import os

    from conftest import SHARED_DATA, TINY

    from cli import client_data

    root = Path(os.environ.get("SE_DATA_DIR", SHARED_DATA))
    if not (root / "MNIST" / "raw").is_dir():
        pytest.skip(f"no offline datasets at {root}")
    out = tmp_path_factory.mktemp("clients")
    config = " ".join(f"{k}={json.dumps(v)}" for k, v in TINY.items())
    assert client_data.main(["--out", str(out), "--run-config", config,
                             "--run-config", f"data-dir='{root}'"]) == 0
    return out


def _node(pid: int, run_config: dict, own: Path | None) -> Context:
    from task.config import fused_run_config

    node_config = {"partition-id": pid, "num-partitions": 8}
    if own is not None:
        node_config["client-data"] = str(own)
    return Context(run_id=1, node_id=1000 + pid, node_config=node_config,
                   state=RecordDict(), run_config=fused_run_config(run_config))


def _train_message(run_config: dict) -> Message:
    from task.config import TaskConfig
    from task.registry import task_of

    model = task_of(TaskConfig.from_run_config(run_config)).model(10)
    config = ConfigRecord({"lr": 0.05, "local-epochs": 1, "batch-size": 16,
                           "server-round": 1})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                               "config": config}), dst_node_id=1003,
                   message_type="train")


def _tiny() -> dict:
    from conftest import TINY

    from task.config import fused_run_config

    return fused_run_config(TINY)


def test_discovery_reports_the_folders_record_count(folders):
    from client_app.app import app

    reply = app(Message(RecordDict(), dst_node_id=1003, message_type="query.discover"),
                _node(3, _tiny(), folders / "client-3"))
    info = reply.content["info"]
    assert (info["partition-id"], info["num-records"]) == (3, 7500)


@pytest.mark.parametrize("kind", ["query.discover", "train", "evaluate"])
def test_a_folder_of_another_partition_is_a_one_line_error_reply(folders, kind):
    from client_app.app import DATA_REFUSED, app

    message = (Message(RecordDict(), dst_node_id=1003, message_type=kind)
               if kind.startswith("query") else _train_message(_tiny()))
    if kind == "evaluate":
        message = Message(RecordDict({"arrays": message.content["arrays"],
                                      "config": ConfigRecord({})}),
                          dst_node_id=1003, message_type="evaluate")
    reply = app(message, _node(3, _tiny(), folders / "client-5"))
    assert reply.has_error() and reply.error.code == DATA_REFUSED
    assert reply.error.reason.endswith("belongs to partition-id 5; this node is "
                                       "partition-id 3")
    assert "\n" not in reply.error.reason


def test_a_folder_whose_classes_do_not_fit_the_model_is_an_error_reply(folders,
                                                                      tmp_path):
    from client_app.app import DATA_REFUSED, app

    x, y, _ = read_client_folder(folders / "client-3")
    write_client_folder(tmp_path / "c3", x, y, "mnist", 3, 7)  # the run's model: 10
    reply = app(_train_message(_tiny()), _node(3, _tiny(), tmp_path / "c3"))
    assert reply.has_error() and reply.error.code == DATA_REFUSED
    assert "its num-classes = 7 does not fit the model received" in reply.error.reason
    assert "\n" not in reply.error.reason


def test_a_folder_the_model_cannot_train_on_is_an_error_reply(folders, tmp_path):
    """Consistent with its manifest, wrong for the model: labels past its classes."""
    from client_app.app import DATA_REFUSED, app

    x, y, _ = read_client_folder(folders / "client-3")
    write_client_folder(tmp_path / "c3", x, np.full_like(np.asarray(y), 50), "mnist", 3,
                        10)
    reply = app(_train_message(_tiny()), _node(3, _tiny(), tmp_path / "c3"))
    assert reply.has_error() and reply.error.code == DATA_REFUSED
    assert "cannot be trained on: IndexError" in reply.error.reason
    assert "\n" not in reply.error.reason


def test_a_damaged_folder_is_an_error_reply_the_server_records(tmp_path, folders):
    """The server stops at discovery with one line naming the node and the folder."""
    import shutil

    from client_app.app import app
    from experiments.grid import InProcessGrid
    from server_app.rounds.federation import DiscoveryError, find_nodes

    own = {p: {"client-data": str(folders / f"client-{p}")} for p in range(8)}
    shutil.copytree(folders / "client-2", tmp_path / "client-2")
    _damage_arrays(tmp_path / "client-2")
    own[2] = {"client-data": str(tmp_path / "client-2")}
    grid = InProcessGrid(app, 8, _tiny(), node_config=own)
    with pytest.raises(DiscoveryError) as err:
        find_nodes(grid, 8, timeout=1)
    assert str(err.value).startswith("node 1002 failed discovery: client-data folder")
    assert "records.npz cannot be read" in str(err.value) and "\n" not in str(err.value)
    # a training message to it: an error reply, screened as a client error
    from server_app.rounds.screening import check_reply

    sent = _train_message(_tiny())
    reply = app(sent, grid.contexts[1002])
    assert check_reply(reply, sent, 64).startswith("client error: client-data folder")


@pytest.mark.inprocess
def test_a_run_on_own_folders_is_the_run_that_cuts_the_partition(run_server, folders,
                                                                 monkeypatch, tmp_path):
    """Same models (files and receipt digests), same summary numbers, with a records
    request naming ids 0-9 of client 3; no client cut the whole dataset."""
    import client_app.app as client_module

    overrides = {"forget-records": "3:0-9", "frameworks": "SE", "mia": False}
    cut, _ = run_server(overrides, run_name="cut")

    def refuse(*args, **kwargs):
        raise AssertionError("a client with its own folder read the whole dataset")

    monkeypatch.setattr(client_module, "cached_client_data", refuse)
    own = {p: {"client-data": str(folders / f"client-{p}")} for p in range(8)}
    mine, _ = run_server(overrides, run_name="own", node_config=own)
    assert _numbers(mine) == _numbers(cut)
    assert mine["learning"]["accuracy"] == cut["learning"]["accuracy"]
    assert _digests(tmp_path / "own") == _digests(tmp_path / "cut")
    assert len(_digests(tmp_path / "cut")) == 3  # v1.npz, SE.npz, the receipt's


def _numbers(summary: dict) -> dict:
    """The summary without its timings (``*_s``, ``seconds``) and its run-name."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if not (
                k.endswith("_s") or k == "seconds" or k == "run-name")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(summary)


def _digests(run: Path) -> list[str]:
    """SHA-256 of the run's model files, and its receipt's models digests."""
    import hashlib

    files = [hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted((run / "models").glob("*.npz"))]
    (receipt,) = (run / "receipts").glob("*.json")
    return [*files, json.dumps(json.loads(receipt.read_text())["models_sha256"])]


@pytest.mark.inprocess
def test_the_reported_count_bounds_a_clients_replies(run_server, folders, tmp_path):
    """Client 2's own data holds 40 records (the cut would give 64): its replies
    claim 40, pass screening; a reply claiming 41 is rejected."""
    from flwr.app import MetricRecord

    x, y, manifest = read_client_folder(folders / "client-2")
    write_client_folder(tmp_path / "own-2", x[:40], y[:40], "mnist", 2, 10)
    own = {2: {"client-data": str(tmp_path / "own-2")}}
    summary, _ = run_server({"frameworks": "SE", "mia": False}, run_name="own",
                            node_config=own)
    assert summary["faults"]["counts"] == {} or not any(
        summary["faults"]["counts"].values()), summary["faults"]

    def claim_41(reply):
        if reply.has_content():
            metrics = dict(reply.content["metrics"])
            reply.content["metrics"] = MetricRecord({**metrics, "num-examples": 41})
        return reply

    summary, _ = run_server({"frameworks": "SE", "mia": False}, run_name="lying",
                            node_config=own, tamper={1002: claim_41})
    entries = summary["faults"]["entries"]
    assert any("num-examples = 41: must be an integer in [1, 40]" in json.dumps(e)
               for e in entries), entries


# ---- the command ------------------------------------------------------------------
def _command(args: list[str], tmp_path: Path, data: Path):
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "SE_DATA_DIR": str(data), "SE_CLI_PROG": "./simulate.sh",
           "SE_CALLER_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "cli", "client-data", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.subprocess
def test_the_command_writes_one_folder_per_client(tmp_path, shared_data):
    """Relative to the caller's folder; each folder is its partition, whole and in order."""
    from task.config import TaskConfig
    from task.data import client_data
    from task.registry import load_data, task_of

    proc = _command(["--out", "clients", "--run-config",
                     "dataset='fmnist' num-clients=3 partition='dirichlet' seed=4 "
                     "mia-unlearn-references=5"], tmp_path, shared_data)
    assert proc.returncode == 0, proc.stderr
    # a run with these settings would be refused: said, not passed over in silence
    note = proc.stderr.strip()
    assert note.startswith("./simulate.sh client-data: note: a run with exactly these "
                           "settings would be refused (run-config '"), note
    assert note.endswith("the folders depend on the task's keys only") and "\n" not in note
    assert len(proc.stdout.splitlines()) == 3
    out = tmp_path / "clients"
    assert sorted(p.name for p in out.iterdir()) == ["client-0", "client-1", "client-2"]
    cfg = TaskConfig.from_run_config(_tiny() | {
        "dataset": "fmnist", "num-clients": 3, "partition": "dirichlet", "seed": 4,
        "data-dir": str(shared_data)})
    data = load_data(task_of(cfg), cfg, str(task_of(cfg).locate(cfg.data_dir)))
    for p in range(3):
        x, y, manifest = read_client_folder(out / f"client-{p}")
        want_x, want_y = client_data(data, p, 3, "dirichlet", 4)
        assert np.array_equal(x, want_x.numpy()) and np.array_equal(y, want_y.numpy())
        assert (manifest.task, manifest.partition_id) == ("fmnist", p)
        assert manifest.cut["partition"] == "dirichlet" and manifest.cut["seed"] == 4


@pytest.mark.subprocess
@pytest.mark.parametrize("args, words", [
    ([], "--out DIR is required"),
    (["--out", "o", "--run-config", "num-clients=0"],
     "'num-clients' = 0 is not allowed: a positive integer"),
    (["--out", "o", "--run-config", "num-clientz=2"], "'num-clientz' is not known"),
    (["--out", "o", "--run-config", "dataset='mnist' data-dir='/nowhere'"],
     "'data-dir' = '/nowhere' is not allowed"),
    (["--out", "o", "--run-config", "partition='pathological' classes-per-client=11 "
      "num-clients=2"], "cannot be built"),
    (["--out", "taken", "--run-config", "num-clients=2"], "already holds client-1"),
    (["--out", "afile", "--run-config", "num-clients=2"], "is a file, not a folder"),
])
def test_the_command_refuses_bad_input_in_one_line(tmp_path, shared_data, args, words):
    (tmp_path / "taken" / "client-1").mkdir(parents=True)
    (tmp_path / "afile").write_text("")
    proc = _command(args, tmp_path, shared_data)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("./simulate.sh: ") and words in lines[0]
    assert not (tmp_path / "o").exists()
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["client-1"]


@pytest.mark.inprocess
def test_records_to_forget_are_checked_against_the_folders_count(run_server, folders,
                                                                 tmp_path):
    """The run would cut 64 records for client 2; its own folder holds 40: id 45 is
    refused in one line once the nodes reported, before any training."""
    from server_app.config import ConfigError

    x, y, _ = read_client_folder(folders / "client-2")
    write_client_folder(tmp_path / "own-2", x[:40], y[:40], "mnist", 2, 10)
    with pytest.raises(ConfigError) as err:
        run_server({"frameworks": "SE", "mia": False, "forget-records": "2:45"},
                   node_config={2: {"client-data": str(tmp_path / "own-2")}})
    assert "client 2 holds 40 records (ids 0..39); 45 is not one (as its own data " \
        "folder reports)" in str(err.value) and "\n" not in str(err.value)


# ---- client-data = true: the server reads only its test set -----------------------
def _refuse_train(monkeypatch):
    """Any read of a training split on this process fails (the clients' own folders
    are read by the ClientApp, never through these)."""
    import torchvision

    import server_app.config.tasks as server_tasks
    from task.data import load_files

    whole = torchvision.datasets.MNIST.__init__

    def test_split_only(self, root, train=True, **kwargs):
        if train:
            raise AssertionError("the server read MNIST's training split")
        whole(self, root, train=train, **kwargs)

    def refuse(*args, **kwargs):
        raise AssertionError("the server loaded the whole task (train and test)")

    load_files.cache_clear()  # nothing read before this test is served from memory
    monkeypatch.setattr(torchvision.datasets.MNIST, "__init__", test_split_only)
    monkeypatch.setattr(server_tasks, "load_data", refuse)


@pytest.mark.parametrize("name", ["mnist", "fmnist", "shakespeare"])
def test_a_builtin_task_loads_its_test_split_alone(shared_data, monkeypatch, name):
    """0 training rows, shaped and typed as the test split; the test split is the
    whole loader's, and MNIST's training files are not opened."""
    from task.config import TaskConfig, fused_run_config
    from task.registry import get_task, load_data, load_test_data

    task = get_task(name)
    cfg = TaskConfig.from_run_config(fused_run_config({"dataset": name}))
    folder = task.locate(str(shared_data))
    whole = load_data(task, cfg, folder)
    with monkeypatch.context() as patch:
        _refuse_train(patch)
        test = load_test_data(task, cfg, folder)
    assert not test.has_train and test.has_classes == whole.has_classes
    assert test.train_x.shape == (0, *whole.test_x.shape[1:])
    assert test.train_x.dtype == whole.test_x.dtype
    assert test.train_y.shape == (0, *whole.test_y.shape[1:])
    assert torch_equal(test.test_x, whole.test_x) and torch_equal(test.test_y,
                                                                  whole.test_y)
    assert test.num_classes == whole.num_classes


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def _config(**values):
    from server_app.config import RunConfig
    from task.config import fused_run_config

    return RunConfig.from_run_config(fused_run_config({"client-data": True, **values}))


@pytest.mark.parametrize("values, key", [
    ({"mia": True}, "mia"),
    ({"mia": True, "mia-shadows": 2}, "mia"),
    ({"mia": False, "forget-labels": "7", "frameworks": "SE"}, "forget-labels"),
])
def test_settings_needing_the_clients_training_data_are_refused(values, key):
    from server_app.config import ConfigError

    with pytest.raises(ConfigError) as err:
        _config(**values)
    line = str(err.value)
    assert line.startswith(f"run-config '{key}' = ") and "\n" not in line
    assert "off with client-data = true" in line
    _config(**{**values, "client-data": False})  # the same without it: allowed


def test_a_plugin_task_without_a_test_only_loader_is_refused():
    from server_app.config import ConfigError
    from server_app.config.tasks import check_task
    from task.interface import Task
    from task.model import CNN

    plug = Task(name="plug", load=lambda settings: None,
                model=lambda classes: CNN(1, 28, classes))
    with pytest.raises(ConfigError) as err:
        check_task(_config(mia=False), plug)
    line = str(err.value)
    assert line.startswith("run-config 'client-data' = True is not allowed") and \
        "no test-only loader (Task.load_test)" in line and "'task'" in line
    assert "\n" not in line
    check_task(_config(mia=False, **{"client-data": False}), plug)


def test_with_client_data_a_node_without_a_folder_fails_discovery():
    from experiments.grid import InProcessGrid
    from server_app.rounds.federation import DiscoveryError, find_nodes

    def client(message, context):
        pid = context.node_config["partition-id"]
        info = {"partition-id": pid, **({"num-records": 9} if pid != 1 else {})}
        return Message(RecordDict({"info": ConfigRecord(info)}), reply_to=message)

    assert find_nodes(InProcessGrid(client, 2, {}), 2, timeout=1).records == {0: 9}
    with pytest.raises(DiscoveryError) as err:
        find_nodes(InProcessGrid(client, 2, {}), 2, timeout=1, own_data=True)
    assert str(err.value).startswith("node 1001 (partition-id 1) reports no "
                                     "num-records: run-config client-data = true")
    assert "\n" not in str(err.value)


@pytest.mark.inprocess
def test_with_client_data_the_server_reads_only_its_test_set(run_server, folders,
                                                            monkeypatch, tmp_path):
    """The run learns, forgets records planned and later, and its models are the
    run's that reads the dataset too (client-data = false), bit for bit; any read
    of a training split on the server fails."""
    import client_app.app as client_module
    from cli.forget import submit_records
    from runstore.inbox import RequestInbox
    from server_app.config import ConfigError

    overrides = {"forget-records": "3:0-9", "frameworks": "SE", "mia": False}
    own = {p: {"client-data": str(folders / f"client-{p}")} for p in range(8)}
    reads, _ = run_server(overrides, run_name="reads", node_config=own)

    def refuse(*args, **kwargs):
        raise AssertionError("a client with its own folder read the whole dataset")

    monkeypatch.setattr(client_module, "cached_client_data", refuse)
    _refuse_train(monkeypatch)
    mine, _ = run_server({**overrides, "client-data": True}, run_name="own",
                         node_config=own)
    assert mine["learning"]["accuracy"] == reads["learning"]["accuracy"] > 0.3
    assert _digests(tmp_path / "own") == _digests(tmp_path / "reads")
    assert [f["path"] for f in mine["data"]["files"]] == [
        "MNIST/raw/t10k-images-idx3-ubyte", "MNIST/raw/t10k-labels-idx1-ubyte"]
    # a later records request, checked against the counts the nodes reported
    with pytest.raises(ConfigError) as err:
        submit_records("own", "3", "7499-7500", str(tmp_path))
    assert "client 3 holds 64 records (ids 0..63)" in str(err.value)
    with pytest.raises(ConfigError) as err:
        submit_records("own", None, None, str(tmp_path), labels="7")
    assert "with client-data = true the server holds none" in str(err.value)
    assert "\n" not in str(err.value)
    rid = submit_records("own", "3", "20-29", str(tmp_path))
    run_server({**overrides, "client-data": True, "later-requests": True},
               run_name="own", node_config=own)
    inbox = RequestInbox(tmp_path / "own" / "run.sqlite")
    try:
        versions = inbox.versions()
    finally:
        inbox.close()
    assert versions[-1].requests == [rid] and len(versions) == 3
    assert (tmp_path / "own" / "receipts" / f"{rid}.json").is_file()


def test_with_client_data_the_commands_checks_read_only_the_test_set(shared_data,
                                                                    monkeypatch):
    """``run``'s preflight (before any engine) loads the test split alone."""
    from conftest import TINY

    from cli.simulation import preflight
    from server_app.config import ConfigError
    from task.config import fused_run_config

    _refuse_train(monkeypatch)
    config = fused_run_config({**TINY, "data-dir": str(shared_data), "mia": False,
                               "client-data": True, "forget-records": "3:0-9",
                               "frameworks": "SE"})
    cfg, _ = preflight(config)
    assert cfg.data.client_data
    with pytest.raises(ConfigError) as err:
        preflight({**config, "mia": True})
    assert str(err.value).startswith("run-config 'mia' = True is not allowed: off "
                                     "with client-data = true")

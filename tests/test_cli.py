"""The command line (cli/): merging, checks before any engine, the run lock, stops.

No Ray and no SuperLink: ``flwr`` is replaced by a fake on PATH that records
being called, so "nothing was started" is checked, not assumed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest
from process_tree import GROUP_CHILD, running

from cli import config
from cli.deploy import deploy_config
from cli.deploy_parts import niced, start_superlink
from cli.main import COMMANDS
from cli.procs import Children, marked_processes
from runstore.catalog import RunLog
from runstore.folder import RunFolder
from server_app.config import ConfigError, RunConfig
from server_app.preflight import validate_run_config

ROOT = Path(__file__).resolve().parents[1]
TINY_RUN = ("num-clients=8 num-shards=2 clients-per-round=4 num-rounds=1 "
            "client-samples=64 test-samples=500 frameworks='none' mia=false")


# ---- merging -------------------------------------------------------------------
def test_preset_then_overrides_later_wins_with_flower_types():
    merged = config.resolve("quick", ["num-rounds=3 lr=0.1 dataset='fmnist'",
                                      "num-rounds=4 mia=false"])
    preset = tomllib.loads((ROOT / "presets" / "quick.toml").read_text())
    assert merged.config["num-rounds"] == 4  # the later --run-config wins
    assert merged.config["client-samples"] == preset["client-samples"]  # the preset
    assert merged.config["batch-size"] == config.defaults()["batch-size"]  # default
    assert merged.config["lr"] == 0.1 and isinstance(merged.config["lr"], float)
    assert merged.config["mia"] is False and merged.config["dataset"] == "fmnist"
    assert merged.overrides["num-rounds"] == 4 and "batch-size" not in merged.overrides
    # what `flwr run --run-config FILE` reads back is what was merged
    assert tomllib.loads(config.to_toml(merged.overrides)) == merged.overrides


def test_a_toml_file_is_one_layer(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('num-rounds = 7\nforget-clients = "1,2"\n')
    merged = config.resolve(None, [str(path), "num-rounds=2"])
    assert merged.config["num-rounds"] == 2
    assert merged.config["forget-clients"] == "1,2"


@pytest.mark.parametrize("item, names", [
    ("num-round=3", ["'num-round'", "num-rounds"]),     # unknown key, closest named
    ("dataset=fmnist", ["'dataset'", "fmnist", "quoted"]),  # a string without quotes
    # a value that is not TOML: the example has its key's type, not quotes
    ("num-rounds=five", ["'num-rounds'", "five", "an integer", "num-rounds=10"]),
    ("lr=fast", ["'lr'", "a number", "lr=0.05"]),
    ("mia=yes", ["'mia'", "true or false"]),
    ("num-rond=x", ["'num-rond'", "not known", "num-rounds"]),  # the key first
    ("num-rounds 3", ["'num-rounds 3'", "key=value"]),  # no pair at all
    ("/nonexistent/x.toml", ["/nonexistent/x.toml"]),
])
def test_unreadable_run_config_is_one_line_naming_it(item, names):
    with pytest.raises(ConfigError) as err:
        config.resolve(None, [item])
    message = str(err.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ConfigError, match="'nope'.*paper.*quick"):
        config.resolve("nope")
    with pytest.raises(ConfigError, match="preset '' does not exist: one of .*quick"):
        config.resolve("")  # an empty name is not "no preset"


def test_pyproject_is_the_one_source_of_defaults():
    assert RunConfig.from_run_config(config.defaults()) == RunConfig()


# ---- checks before any work ----------------------------------------------------
@pytest.mark.parametrize("overrides, key", [
    ({"forget-clients": "-1"}, "forget-clients"),
    ({"forget-clients": "3,3"}, "forget-clients"),
    ({"lr": float("inf")}, "lr"),
    ({"momentum": float("nan")}, "momentum"),
    ({"num-clients": 4, "num-shards": 2, "clients-per-round": 2, "num-requests": 3},
     "num-requests"),
])
def test_preflight_names_the_key(overrides, key):
    with pytest.raises(ConfigError, match=f"'{key}'") as err:
        validate_run_config({**config.defaults(), **overrides})
    assert "\n" not in str(err.value)


def test_serverapp_runs_the_same_check_first():
    from flwr.app import Context, RecordDict

    from server_app.app import main

    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config={**config.defaults(), "forget-clients": "-1"})
    with pytest.raises(ConfigError, match="'forget-clients' = '-1'"):
        main(None, context)  # the grid is never touched


def test_deploy_shrinks_a_preset_but_not_explicit_values():
    merged = deploy_config(8, "paper", [])  # paper: 100 clients, 4 shards, 20 a round
    assert merged.config["num-clients"] == 8 and merged.config["num-shards"] == 4
    assert merged.config["clients-per-round"] == 8
    assert merged.config["num-rounds"] == 30 and "deploy8" in merged.config["run-name"]
    validate_run_config(merged.config)  # the shrunk topology is valid
    assert deploy_config(3, "paper", []).config["num-shards"] == 2  # a shard of two
    explicit = deploy_config(3, "paper", ["num-shards=2"]).config
    assert explicit["num-shards"] == 2 and explicit["clients-per-round"] == 2
    with pytest.raises(ConfigError, match="'num-clients' = 5"):
        deploy_config(3, None, ["num-clients=5"])


@pytest.mark.subprocess
@pytest.mark.parametrize("value", ["20", "-1", "x", "2.5"])
def test_deploy_control_nice_out_of_range_is_one_line_before_anything(tmp_path, value):
    proc, record = _cli(["deploy", "2", "--control-nice", value, "--run-config",
                         TINY_RUN], tmp_path)
    assert proc.returncode == 2
    assert f"N must be a niceness 0-19, got '{value}'" in proc.stderr
    assert not record.exists()  # exits at parsing, before the run config or flwr


@pytest.mark.subprocess
@pytest.mark.parametrize("nice", [0, 3])
def test_control_plane_processes_start_at_the_given_niceness(nice):
    probe = "import os; print(os.nice(0))"
    base = int(subprocess.run([sys.executable, "-c", probe], capture_output=True,
                              text=True, check=True).stdout)
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, preexec_fn=niced(nice)).stdout
    assert int(got) == min(19, base + nice)
    assert os.nice(0) == base  # this process is unchanged


@pytest.mark.subprocess
def test_local_superlink_keeps_its_state_in_memory_at_the_given_niceness(tmp_path):
    """No ``--database``: Flower's in-memory state (an SQLite file cost 42 s of CPU)."""
    started = []

    class Recorder:  # a Children that records what it would start
        def start(self, argv, **kw):
            started.append((list(argv), kw))
            return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])

    (tmp_path / "logs").mkdir()
    with socket.socket() as listener:  # the "SuperLink" port accepts at once
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        proc = start_superlink(Recorder(), tmp_path, listener.getsockname()[1], nice=4)
    proc.kill()
    proc.wait()
    (argv, kw), = started
    assert argv[0] == "flower-superlink" and "--database" not in argv
    assert kw["preexec_fn"].args == (4,)  # os.nice(4) in the child
    # its ServerApps get the deployment layer's fast replies (docs/DEPLOY.md)
    assert kw["env"]["SE_DEPLOY_GRID_HOOK"] == "cli.polling_grid:fast_replies"


def _cli(args, tmp_path, extra_env=None, timeout=60, then=""):
    """``python -m cli ARGS`` with a fake flwr that records its calls (then ``then``)."""
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    record = tmp_path / "flwr-called"
    (fake / "flwr").write_text(f'#!/bin/sh\necho "$@" >> "{record}"\n{then}')
    (fake / "flwr").chmod(0o755)
    env = {**os.environ, "PATH": os.pathsep.join(
        [str(fake), str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "SE_RESULTS_DIR": str(tmp_path / "results"),
        "FLWR_HOME": str(tmp_path / "flwr_home"), **(extra_env or {})}
    proc = subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc, record


@pytest.mark.subprocess
@pytest.mark.parametrize("value, key", [("forget-clients='-1'", "forget-clients"),
                                        ("lr=inf", "lr"),
                                        ("num-rounds='5'", "num-rounds")])
def test_bad_value_exits_2_with_one_line_and_starts_nothing(tmp_path, value, key):
    proc, record = _cli(["run", "--run-config", TINY_RUN, "--run-config", value],
                        tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"'{key}'" in lines[0], proc.stderr
    assert not record.exists()  # no engine was started


@pytest.mark.subprocess
def test_good_config_reaches_flwr(tmp_path):
    """The control for the test above: the fake flwr does record a call."""
    proc, record = _cli(["--run-config", TINY_RUN], tmp_path)
    assert proc.returncode == 1  # the fake wrote no summary.json
    assert "no summary.json" in proc.stderr
    call = record.read_text()
    assert call.startswith("run ") and "--stream" in call and "num-supernodes=8" in call
    assert not list((tmp_path / "flwr_home").glob("sim-*"))  # its FLWR_HOME is gone


@pytest.mark.subprocess
@pytest.mark.parametrize("flag, want", [([], ""), (["--verbose"], "1")])
def test_verbose_reaches_the_engine_as_se_verbose(tmp_path, monkeypatch, flag, want):
    """``--verbose``: SE_VERBOSE=1 for flwr run (its SuperLink and ServerApp inherit it)."""
    monkeypatch.delenv("SE_VERBOSE", raising=False)
    seen = tmp_path / "se-verbose"
    proc, record = _cli(["run", *flag, "--run-config", TINY_RUN], tmp_path,
                        then=f'echo "[$SE_VERBOSE]" >> "{seen}"\n')
    assert record.exists(), proc.stderr
    assert seen.read_text().strip() == f"[{want}]"


@pytest.mark.subprocess
def test_a_superlink_that_does_not_start_in_time_is_started_again(tmp_path):
    """flwr's 15 s start-up limit of its local SuperLink: tried 3 times, then failed."""
    proc, record = _cli(["--run-config", TINY_RUN], tmp_path, then=(
        'echo "Failed to start local SuperLink within 15s."\nexit 1\n'))
    assert proc.returncode == 1 and "no summary.json" in proc.stderr
    assert len(record.read_text().splitlines()) == 3
    assert proc.stderr.count("starting again") == 2


# ---- the run lock ----------------------------------------------------------------
HOLDER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from server_app.config import RunConfig
    from runstore.folder import RunFolder
    from runstore.catalog import RunLog
    cfg = RunConfig.of(results_dir={results!r}, run_name="live", num_clients=8,
                    num_shards=2, clients_per_round=4)
    folder = RunFolder.start(cfg.output.resolved_results_dir(), cfg.resolved_run_name())
    RunLog(folder.runlog_path, cfg.as_dict())
    print("locked", flush=True)
    time.sleep(120)
""")


@pytest.mark.subprocess
def test_a_live_run_is_not_joined_and_a_killed_one_resumes(tmp_path):
    results = tmp_path / "results"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(root=str(ROOT), results=str(results))],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        cfg = RunConfig.of(results_dir=str(results), run_name="live", num_clients=8,
                        num_shards=2, clients_per_round=4)
        with pytest.raises(ConfigError, match=f"still going \\(pid {holder.pid} "):
            RunFolder.start(cfg.output.resolved_results_dir(), cfg.resolved_run_name())
        # the command line refuses it too, before any engine starts
        proc, record = _cli(["--run-config", TINY_RUN + " run-name='live'"], tmp_path,
                            {"SE_RESULTS_DIR": str(results)})
        assert proc.returncode == 2 and "still going" in proc.stderr
        assert not record.exists()
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        # the killed run resumes in its folder
        folder = RunFolder.start(cfg.output.resolved_results_dir(), cfg.resolved_run_name())
        assert folder.path == results / "live"
        assert RunLog(folder.runlog_path, cfg.as_dict()).resumed
        assert not list(results.glob("live.failed-*"))
        folder.release()
    finally:
        holder.kill()
        holder.wait()


# ---- stopping every process --------------------------------------------------------
DRIVER = textwrap.dedent("""
    import subprocess, sys, time
    sys.path.insert(0, {root!r})
    from cli.procs import Children, exit_on_signals
    CHILD = {child!r}
    exit_on_signals("driver")
    with Children(grace_s=1.0) as children:
        child = children.start([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                               text=True)
        print(children.mark, child.pid, child.stdout.readline().strip(), flush=True)
        time.sleep(300)
""")



@pytest.mark.subprocess
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")
def test_sigterm_stops_children_and_grandchildren():
    script = DRIVER.format(root=str(ROOT), child=GROUP_CHILD)
    driver = subprocess.Popen([sys.executable, "-c", script],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        mark, *pids = driver.stdout.readline().split()
        pids = [int(p) for p in pids]
        assert len(pids) == 4 and all(running(p) for p in pids)
        assert set(pids[1:]) <= set(marked_processes(mark))
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.time() + 5
        while any(running(p) for p in pids) and time.time() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if running(p)]
        assert "SIGTERM" in driver.stderr.read()
    finally:
        driver.kill()
        driver.wait()


def test_children_stop_is_idempotent_and_reports_nothing_left():
    with Children(grace_s=1.0) as children:
        proc = children.start(["sleep", "30"])
    assert proc.returncode == -signal.SIGTERM
    assert children.stop() == [] and children.alive() == []


# ---- paths and the data check before any engine ----------------------------------
def test_a_summary_path_with_spaces_is_found(tmp_path):
    from cli.simulation import summary_path

    summary = tmp_path / "my results" / "run 1" / "summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text("{}")
    log = tmp_path / "log"
    log.write_bytes(b"INFO :      results: x\nINFO :      summary: " + str(summary).encode()
                    + b"\nINFO :      done\n")
    assert summary_path(log) == summary


def test_relative_paths_reach_the_serverapp_absolute(tmp_path, monkeypatch):
    from cli.simulation import absolute_paths

    monkeypatch.chdir(tmp_path)
    merged = absolute_paths(config.resolve(None, ["data-dir='data' results-dir='out/'"]))
    for key, name in (("data-dir", "data"), ("results-dir", "out")):
        assert merged.config[key] == merged.overrides[key] == str(tmp_path / name)


@pytest.mark.subprocess
def test_a_partition_that_cannot_be_built_stops_before_any_engine(tmp_path, shared_data):
    proc, record = _cli(["--run-config", TINY_RUN + " num-clients=100000",
                         "--run-config", f"data-dir='{shared_data}'"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "'num-clients' = 100000 with partition = 'iid'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not record.exists()


def test_another_spelling_of_the_same_results_dir_resumes(tmp_path, shared_data):
    from conftest import TINY

    from server_app.app import prepare

    base = {**config.defaults(), **TINY, "data-dir": str(shared_data), "run-name": "s"}
    first = prepare({**base, "results-dir": str(tmp_path) + "/"})
    first.catalog.close()
    first.folder.release()
    again = prepare({**base, "results-dir": str(tmp_path / "x" / "..")})
    assert again.catalog.resumed and again.folder.path == first.folder.path
    again.catalog.close()
    again.folder.release()


def test_typed_paths_are_the_callers_and_children_get_them_absolute(tmp_path,
                                                                      monkeypatch):
    """simulate.sh installs from the project folder; the command then works in the
    caller's folder (an export's --out lands there) and hands its children absolute
    paths, since they run in the project folder."""
    from cli.env import back_to_caller, setup_env

    caller = tmp_path / "mine"
    caller.mkdir()
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("SE_CALLER_DIR", str(caller))
    back_to_caller(stays=True)  # the test suite stays in the project
    assert Path.cwd() == ROOT and "SE_CALLER_DIR" not in os.environ
    monkeypatch.setenv("SE_CALLER_DIR", str(caller))
    back_to_caller()
    assert Path.cwd() == caller
    env = setup_env({"PYTHONPATH": f"plug{os.pathsep}/abs/x", "SE_RESULTS_DIR": "out",
                     "FLWR_HOME": str(tmp_path / "home"), "RAY_TMPDIR": "ray"})
    assert env["PYTHONPATH"] == f"{caller / 'plug'}{os.pathsep}/abs/x"
    assert env["SE_RESULTS_DIR"] == str(caller / "out")
    assert (caller / "out").is_dir() and (caller / "ray").is_dir()


@pytest.mark.parametrize("args, env, want", [
    ([], {}, ["-n", "auto"]),
    (["-x"], {"SE_TEST_WORKERS": "3"}, ["-n", "3", "-x"]),
    (["-n", "0"], {}, ["-n", "0"]),
    (["-n2", "-q"], {}, ["-n2", "-q"]),
    (["--numprocesses=2"], {}, ["--numprocesses=2"]),
    (["-p", "no:xdist"], {}, ["-p", "no:xdist"]),
    (["-q"], {"SE_TEST_WORKERS": "0"}, ["-q"]),
])
def test_the_test_command_adds_workers_unless_told_otherwise(monkeypatch, args, env, want):
    from cli.main import _test_workers

    monkeypatch.delenv("SE_TEST_WORKERS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert _test_workers(args) == want


@pytest.mark.subprocess
@pytest.mark.parametrize("spec, ours, theirs, how", [
    ("task:make_task", "task", "task.py", "caller"),
    ("examples.digits:task", "examples", "examples", "pythonpath")])
def test_a_plugin_that_ours_would_shadow_is_one_line_before_any_engine(
        tmp_path, spec, ours, theirs, how):
    """Issue 41, item 6: the user's task.py / examples/ (their folder, or on PYTHONPATH)."""
    mine = tmp_path / "mine"
    (mine / "examples").mkdir(parents=True)
    (mine / "task.py").write_text("def make_task():\n    return None\n")
    (mine / "examples" / "digits.py").write_text("task = None\n")
    where = {"SE_CALLER_DIR": str(mine)} if how == "caller" else {"PYTHONPATH": str(mine)}
    proc, record = _cli(["run", "--run-config", TINY_RUN, "--run-config",
                         f"task='{spec}'"], tmp_path, extra_env=where)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'task'" in lines[0], proc.stderr
    assert str(ROOT / ours) in lines[0] and str(mine / theirs) in lines[0], lines[0]
    assert not record.exists()  # no engine was started


def test_experiments_are_not_a_command_of_the_cli(capsys):
    """Issue 53: the experiments are a program above the app (``python -m
    experiments.run``; ``./simulate.sh experiments`` starts it); the CLI refuses
    the name in one line rather than start it."""
    from cli.main import main

    assert main(["experiments", "pareto"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "python -m experiments.run" in err


@pytest.mark.parametrize("argv, words", [
    (["forgt", "--run", "x"], ["no command 'forgt'", "did you mean forget?",
                               "client-data"]),
    (["--foo"], ["unrecognized arguments: --foo", "--help"]),
    (["forget", "--run"], ["argument --run: expected one argument",
                           "forget --help"]),
    (["models"], ["the following arguments are required: --run"]),
])
def test_a_bad_command_line_is_one_line_and_exit_2(argv, words, capsys):
    """A mistyped command is named with the closest one; argparse's refusals are
    one line (no usage block) pointing at ``--help``."""
    from cli.main import main

    try:
        status = main(argv)
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    for word in words:
        assert word in err, err


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "test"])
def test_every_command_refuses_an_unknown_option_in_one_line(command, capsys):
    """The kind, not one case: each command's parser is :class:`cli.terminal.Parser`."""
    from cli.main import main

    try:
        status = main([command, "--no-such-option"])
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert "--help` lists the options" in err, err  # a missing --run may come first


@pytest.mark.parametrize("args, words", [
    (["--supernodes", "-1"], "--supernodes -1 is not allowed: at least num-clients = 8"),
    (["--supernodes", "0"], "--supernodes 0 is not allowed"),
    (["--supernodes", "7"], "--supernodes 7 is not allowed"),
    (["--run-config", "later-requests=true"], "'later-requests' = true is not allowed"),
])
def test_what_the_engine_cannot_use_is_refused_before_it_starts(args, words, tmp_path,
                                                               monkeypatch, capsys):
    """Fewer SuperNodes than clients (discovery would time out in the engine) and the
    forget command's own key: one line, exit 2, no engine, no run folder."""
    from cli import simulation
    from cli.main import main

    monkeypatch.setattr(simulation, "launch", lambda *a, **k: pytest.fail("launched"))
    status = main(["--run-config", f"num-clients=8 num-shards=2 clients-per-round=4 "
                   f"results-dir='{tmp_path}'", *args])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and words in err, err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv, words", [
    (["forget", "--run", "r", "--client", "3"], "unrecognized arguments: --client"),
    (["receipts", "--run", "r", "--det"], "unrecognized arguments: --det"),
    (["models", "--runn", "r"], "unrecognized arguments: --runn"),  # not "--run required"
    (["export", "--run", "r", "--version", "vv", "--out", "x.pt"],
     "'vv' is not a version: N or vN"),
])
def test_option_names_are_exact_and_an_unknown_one_is_named(argv, words, capsys):
    """Found by a newcomer: ``forget --client 3`` was taken as ``--clients`` and forgot
    client 3 for good; ``models --runn`` said --run was missing."""
    from cli.main import main

    try:
        status = main(argv)
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and words in err, err


def test_export_takes_a_version_as_models_lists_it():
    from cli.models import _version

    assert _version("v3") == _version("3") == 3

"""Later requests on the run's own federation (#54): the route and the stored settings.

Fast checks of the decisions; the run on separate network hosts is
``tests/test_hosts.py::test_forget_goes_to_the_runs_own_federation``.
"""

from __future__ import annotations

import json

import pytest

from cli.later_route import HERE, Route, flwr_error, route, unreachable
from runstore.catalog import RunLog
from server_app.config import ConfigError
from server_app.forget_run import stored_run_config
from task.config import default_run_config, fused_run_config
from tests.conftest import TINY
from tests.test_nothing_half_done import NAME, _where, finished, run  # noqa: F401

SETTINGS = {**fused_run_config({**TINY, "mia": False}), "run-name": "dep1"}


def _run(tmp_path, engine: dict | None = None):
    folder = tmp_path / "results" / "dep1"
    folder.mkdir(parents=True)
    log = RunLog(folder / "run.sqlite", {**SETTINGS, "results-dir": str(folder.parent)})
    if engine is not None:
        log.record_once("engine", json.dumps(engine))
    log.close()
    return folder


def _connections(tmp_path, monkeypatch, *names: str) -> None:
    home = tmp_path / "flwr_home"
    home.mkdir()
    (home / "config.toml").write_text("".join(
        f'[superlink.{n}]\naddress = "127.0.0.1:9093"\ninsecure = true\n' for n in names))
    monkeypatch.setenv("FLWR_HOME", str(home))


def test_the_serverapp_reads_the_runs_stored_settings(tmp_path):
    folder = _run(tmp_path)
    typed = fused_run_config({"forget-run": "dep1", "results-dir": str(folder.parent)})
    got = stored_run_config(typed, default_run_config())
    assert got["later-requests"] is True and got["num-clients"] == TINY["num-clients"]
    assert got["client-samples"] == TINY["client-samples"]  # not the default
    assert stored_run_config({"lr": 0.1}, default_run_config()) == {"lr": 0.1}


def test_a_key_typed_with_forget_run_that_differs_is_refused_naming_it(tmp_path):
    folder = _run(tmp_path)
    typed = fused_run_config({"forget-run": "dep1", "results-dir": str(folder.parent),
                              "num-rounds": 7, "client-samples": TINY["client-samples"]})
    with pytest.raises(ConfigError, match=r"run-config num-rounds given with forget-run "
                       r"= 'dep1'.*show --run dep1"):
        stored_run_config(typed, default_run_config())


@pytest.mark.parametrize("name, words", [("nope", "no run there"),
                                         ("../x", "is not allowed")])
def test_forget_run_naming_no_run_is_one_line(tmp_path, name, words):
    _run(tmp_path)
    typed = fused_run_config({"forget-run": name,
                              "results-dir": str(tmp_path / "results")})
    with pytest.raises(ConfigError, match=words) as err:
        stored_run_config(typed, default_run_config())
    assert "\n" not in str(err.value)


def test_a_deployed_run_goes_back_to_its_federation(tmp_path, monkeypatch):
    folder = _run(tmp_path, {"kind": "deployment", "federation": "prod"})
    _connections(tmp_path, monkeypatch, "prod", "other")
    assert route(folder, None, None) == Route("federation", "prod")
    assert route(folder, None, "other") == Route("federation", "other")
    assert route(folder, "simulation", None) == HERE  # asked for by name


def test_a_deployed_run_is_never_replayed_here_unless_asked(tmp_path, monkeypatch):
    _connections(tmp_path, monkeypatch, "other")
    gone = _run(tmp_path, {"kind": "deployment", "federation": "se-deploy-4000"})
    with pytest.raises(ConfigError, match=r"'se-deploy-4000' is not a connection of "
                       r".*--engine simulation to replay it on this machine; nothing was "
                       r"recorded"):
        route(gone, None, None)
    unnamed = tmp_path / "u"
    folder = _run(unnamed, {"kind": "deployment", "federation": ""})
    with pytest.raises(ConfigError, match="recorded no federation: .*--federation NAME"):
        route(folder, None, None)
    with pytest.raises(ConfigError, match="give one of them"):
        route(folder, "simulation", "other")


def test_a_simulated_run_stays_in_simulation(tmp_path, monkeypatch):
    _connections(tmp_path, monkeypatch, "prod")
    assert route(_run(tmp_path, {"kind": "simulation", "federation": ""}), None,
                 None) == HERE
    assert route(_run(tmp_path / "old"), None, None) == HERE  # recorded no engine


def test_an_unreachable_superlink_reads_as_one_line(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(
        "Using SuperLink: dead (127.0.0.1:59999)\n"
        "╭─ Error ──────────────────────────────────╮\n"
        "│ Connection to the SuperLink is unavailable. Please check your network │\n"
        "│ connection and 'address' in the SuperLink connection configuration.   │\n"
        "╰──────────────────────────────────────────╯\n")
    assert unreachable(log) == ("Connection to the SuperLink is unavailable. Please "
                                "check your network connection and 'address' in the "
                                "SuperLink connection configuration.")
    log.write_text("Successfully started run 12\n")
    assert unreachable(log) is None
    assert flwr_error("no box here") == ""


def test_every_training_message_carries_the_runs_client_settings():
    """A client whose own run config is the app's defaults trains on the run's."""
    from server_app.config import RunConfig
    from server_app.run.context import train_config
    from task.config import RUN_CONFIG_KEY, TaskConfig, run_config_of

    settings = fused_run_config({**TINY, "mia": False, "data-dir": "/server/data"})
    record = train_config(RunConfig.from_run_config(settings), "/server/data")
    client = run_config_of(default_run_config(), record)
    got, want = TaskConfig.from_run_config(client), TaskConfig.from_run_config(settings)
    assert got.client_samples == want.client_samples == TINY["client-samples"]
    assert got.num_clients == want.num_clients == TINY["num-clients"]
    assert client["data-dir"] == default_run_config()["data-dir"]  # the node's own
    assert "results-dir" not in json.loads(record[RUN_CONFIG_KEY])
    with pytest.raises(ValueError, match="is not JSON"):
        run_config_of({}, {RUN_CONFIG_KEY: "{"})
    with pytest.raises(ValueError, match="must be a JSON object of the keys"):
        run_config_of({}, {RUN_CONFIG_KEY: json.dumps({"results-dir": "/x"})})
    assert run_config_of({"seed": 1}, {}) == {"seed": 1}  # an older server's message


@pytest.mark.inprocess
def test_show_prints_a_runs_status_engine_settings_and_tables(run, capsys):  # noqa: F811
    from cli.main import main as cli_main

    capsys.readouterr()
    assert cli_main(["show", *_where(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"run {NAME}: finished; engine InProcessGrid; model versions 1;"
                          " waiting requests none"), out[:300]
    assert "client-samples=64" in out and "frameworks=\"none\"" in out
    assert "dataset mnist" in out  # the result tables
    (run / "summary.json").unlink()  # not finished (yet): exit 1, no tables
    assert cli_main(["show", *_where(run)]) == 1
    out, err = capsys.readouterr()
    assert "not finished" in out and err.count("\n") == 1  # and why, on stderr
    assert "has no summary.json and no process works on it (1 model version(s)" in err
    assert "or its summary.json was removed (restore it)" in err


@pytest.mark.inprocess
def test_a_run_may_use_fewer_clients_than_are_connected(make_grid, tmp_path, shared_data):
    """5 nodes connected, num-clients = 4: the run uses partitions 0..3 and records it."""
    from flwr.app import Context, RecordDict

    from server_app.app import main

    config = fused_run_config({**TINY, "num-clients": 4, "mia": False,
                               "frameworks": "none", "run-name": "few",
                               "data-dir": str(shared_data), "results-dir": str(tmp_path)})
    grid = make_grid(5, config)
    main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                       run_config=config))
    summary = json.loads((tmp_path / "few" / "summary.json").read_text())
    assert any("left out: partition ids [4]" in n for n in summary["notes"])
    from runstore.inbox import RequestInbox

    inbox = RequestInbox(tmp_path / "few" / "run.sqlite", read_only=True)
    try:
        nodes = json.loads(inbox.get_meta("nodes"))
    finally:
        inbox.close()
    assert nodes["left_out"] == [4] and "0..num-clients - 1" in nodes["rule"]


def test_a_run_made_before_a_key_existed_still_takes_later_requests(tmp_path):
    """A key added since, at its default, is no settings mismatch; another value is."""
    from runstore.catalog import SettingsMismatchError

    full = {**SETTINGS, "results-dir": str(tmp_path)}
    older = {k: v for k, v in full.items() if k != "device-profile"}
    RunLog(tmp_path / "run.sqlite", older).close()
    RunLog(tmp_path / "run.sqlite", full).close()  # the same run
    with pytest.raises(SettingsMismatchError, match=r"\['device-profile'\]"):
        RunLog(tmp_path / "run.sqlite", {**full, "device-profile": "gpu-assumed"})

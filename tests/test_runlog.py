import pytest

from server_app.runlog import RunLog, RunLogError


def test_requests_are_recorded_once_and_states_move(tmp_path):
    log = RunLog(tmp_path / "run.sqlite", {"seed": 0})
    assert not log.resumed
    assert log.record_requests([[3, 1], [7]]) == [[1, 3], [7]]
    log.set_request_state("in_progress")
    log.close()
    again = RunLog(tmp_path / "run.sqlite", {"seed": 0})
    assert again.resumed
    # a resumed run keeps the stored requests, whatever it would generate now
    assert again.record_requests([[9]]) == [[1, 3], [7]]
    assert [s for _, _, s in again.requests()] == ["in_progress", "in_progress"]
    again.set_request_state("done")
    assert [s for _, _, s in again.requests()] == ["done", "done"]
    with pytest.raises(ValueError, match="request state"):
        again.set_request_state("lost")


def test_stages(tmp_path):
    log = RunLog(tmp_path / "run.sqlite", {})
    assert log.stage("learn") is None and log.done("learn") is None
    log.begin("learn")
    assert log.stage("learn") == ("in_progress", None) and log.done("learn") is None
    log.finish("learn", {"accuracy": 0.9})
    assert log.done("learn") == {"accuracy": 0.9}


def test_other_settings_are_refused(tmp_path):
    RunLog(tmp_path / "run.sqlite", {"seed": 0, "lr": 0.1}).close()
    with pytest.raises(RunLogError, match=r"\['lr'\]"):
        RunLog(tmp_path / "run.sqlite", {"seed": 0, "lr": 0.2})

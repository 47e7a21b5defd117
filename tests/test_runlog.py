import pytest

from runstore.catalog import RunLog, RunLogError


def test_requests_are_recorded_once_and_states_move(tmp_path):
    log = RunLog(tmp_path / "run.sqlite", {"seed": 0})
    assert not log.resumed
    assert log.record_requests([[3, 1], [7]]) == [[1, 3], [7]]
    log.set_request_state("in_progress")
    log.close()
    again = RunLog(tmp_path / "run.sqlite", {"seed": 0})
    assert again.resumed
    # a resumed run plans the same requests (seeded); other stored ones are damage
    assert again.record_requests([[1, 3], [7]]) == [[1, 3], [7]]
    with pytest.raises(RunLogError, match=r"recorded requests \[\[1, 3\], \[7\]\] "
                       r"are not the planned \[\[9\]\]"):
        again.record_requests([[9]])
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


def test_a_damaged_stage_result_is_a_clear_error(tmp_path):
    from runstore.summary import FrameworkSummary, RequestCost

    log = RunLog(tmp_path / "run.sqlite", {})
    good = FrameworkSummary(requests=[RequestCost(0, [2])], noop=True)
    log.finish("unlearn:SE", good.to_json())
    assert log.done_as("unlearn:SE", FrameworkSummary).to_json() == good.to_json()
    log.finish("unlearn:SE", {"x": 1})
    with pytest.raises(RunLogError, match="run.sqlite: the stored result of stage "
                       "'unlearn:SE' is damaged"):
        log.done_as("unlearn:SE", FrameworkSummary)


def test_a_garbage_catalog_file_is_one_line_naming_it(tmp_path):
    from history.catalog import StoreError

    path = tmp_path / "run.sqlite"
    path.write_bytes(b"garbage" * 100)
    with pytest.raises(StoreError) as err:
        RunLog(path, {})
    assert str(path) in str(err.value) and "\n" not in str(err.value)

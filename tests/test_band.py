"""experiments.band: FR's band over seeds and the equivalence test (issue 27 item 4)."""

import json
import math
import statistics

import pytest

from experiments import band


def _summary(seed: int, values: dict[str, dict[str, float]], **config) -> dict:
    blocks = {m: dict(v) for m, v in values.items() if m != "original"}
    return {"config": {"dataset": "fmnist", "seed": seed, "run-name": f"s{seed}",
                       **config},
            "original": dict(values.get("original", {})), "frameworks": blocks}


def _welch_p(a, b, shift):
    """One-sided p of mean(a) + shift > mean(b), Welch's t by hand."""
    from scipy import stats

    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    t = (statistics.fmean(a) + shift - statistics.fmean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return stats.t.sf(t, df)


def test_band_is_the_range_mean_and_spread():
    b = band.Band.of([0.5, 0.52, 0.49])
    assert (b.low, b.high) == (0.49, 0.52)
    assert b.mean == pytest.approx(0.5033333)
    assert b.std == pytest.approx(statistics.stdev([0.5, 0.52, 0.49]))
    assert b.holds(0.5) and not b.holds(0.53)
    assert band.Band.of([0.4]).std is None


@pytest.mark.parametrize("values", [[], [0.5, float("nan")], [float("inf")]])
def test_band_refuses_what_is_not_a_number(values):
    with pytest.raises(ValueError, match="finite values"):
        band.Band.of(values)


def test_tost_is_two_one_sided_welch_tests():
    a, b = [0.51, 0.50, 0.52, 0.505], [0.515, 0.51, 0.52, 0.50, 0.515]
    test = band.tost(a, b, 0.05)
    lower = _welch_p(a, b, 0.05)          # a + margin > b
    upper = 1 - _welch_p(a, b, -0.05)     # a - margin < b
    assert test.p == pytest.approx(max(lower, upper))
    assert test.equivalent is True and test.diff == pytest.approx(
        statistics.fmean(a) - statistics.fmean(b))


def test_tost_finds_a_difference_larger_than_the_margin():
    test = band.tost([0.70, 0.68, 0.69], [0.51, 0.52, 0.50, 0.515, 0.505], 0.05)
    assert test.equivalent is False and test.p > 0.5


def test_tost_without_spread_and_with_one_seed():
    assert band.tost([0.0, 0.0], [0.0, 0.0, 0.0], 0.02).equivalent is True
    assert band.tost([0.05, 0.05], [0.0, 0.0], 0.02).equivalent is False
    one = band.tost([0.5], [0.5, 0.51], 0.05)
    assert one.equivalent is None and one.p is None and "2 seeds" in one.reason
    with pytest.raises(ValueError, match="margin"):
        band.tost([0.5, 0.5], [0.5, 0.5], 0.0)
    with pytest.raises(ValueError, match="finite values"):
        band.tost([0.5, float("nan")], [0.5, 0.5], 0.05)
    # one sample without spread, the other with: Welch's t still applies
    one_flat = band.tost([0.5, 0.5, 0.5], [0.49, 0.51, 0.50], 0.05)
    assert one_flat.equivalent is True and one_flat.p == pytest.approx(
        max(_welch_p([0.5] * 3, [0.49, 0.51, 0.50], 0.05),
            1 - _welch_p([0.5] * 3, [0.49, 0.51, 0.50], -0.05)))
    # exactly the margin apart without spread: not equivalent (strictly inside only)
    assert band.tost([0.52, 0.52], [0.50, 0.50], 0.02).equivalent is False


def test_compare_reads_each_model_against_fr():
    fr = [0.51, 0.52, 0.50, 0.515, 0.505]
    se = [0.505, 0.515, 0.51]
    runs = [_summary(s, {"original": {"mia_lira_auc": 0.67 + s / 100},
                         "FR": {"mia_lira_auc": fr[s]},
                         **({"SE": {"mia_lira_auc": se[s]}} if s < 3 else {})})
            for s in range(5)]
    rows = {r["model"]: r for r in band.compare(runs)}
    assert set(rows) == {"original", "SE"}
    assert rows["SE"]["fr_band"] == [0.50, 0.52] and rows["SE"]["fr_seeds"] == 5
    assert rows["SE"]["seeds"] == 3 and rows["SE"]["inside_band"] is True
    assert rows["original"]["inside_band"] is False
    assert rows["original"]["equivalent"] is False
    # the difference is the model's mean minus FR's, and its p the TOST of both
    assert rows["SE"]["diff"] == pytest.approx(statistics.fmean(se) - statistics.fmean(fr))
    assert rows["SE"]["p"] == pytest.approx(band.tost(se, fr, 0.05).p)
    assert rows["SE"]["p"] < 0.05 and rows["SE"]["equivalent"] is True
    assert "| mia_lira_auc | SE |" in band.markdown(band.compare(runs))


def test_compare_refuses_runs_of_different_settings_and_without_fr():
    fr = {"FR": {"mia_auc": 0.5}}
    with pytest.raises(ValueError, match="'num-rounds': 10 vs 8"):
        band.compare([_summary(0, fr, **{"num-rounds": 10}),
                      _summary(1, fr, **{"num-rounds": 8})])
    # a key only one run has (added to the app between them) is not a difference
    band.compare([_summary(0, fr, **{"new-key": 1}), _summary(1, fr)])
    with pytest.raises(ValueError, match="no FR results"):
        band.compare([_summary(0, {"SE": {"mia_auc": 0.5}})])


def test_command_writes_rows_and_refuses_bad_input_in_one_line(tmp_path, capsys):
    paths = []
    for s, v in enumerate([0.01, 0.015, 0.005]):
        path = tmp_path / f"s{s}.json"
        path.write_text(json.dumps(_summary(s, {"FR": {"mia_lira_tpr_at_1fpr": v},
                                                "SE": {"mia_lira_tpr_at_1fpr": v}})))
        paths.append(str(path))
    out = tmp_path / "band.json"
    assert band.main(["--json", str(out), *paths]) == 0
    assert json.loads(out.read_text())["rows"][0]["model"] == "SE"
    assert band.main([str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("band: ") and "missing.json" in err[0]

import numpy as np
import pytest

from strategies.calibration import calibrate, difference, weighted_step


def test_calibrate_keeps_new_direction_and_stored_magnitude_per_layer():
    stored = {"a": np.array([3.0, 4.0], np.float32),       # norm 5
              "b": np.array([[0.0, 2.0]], np.float32)}     # norm 2
    fresh = {"a": np.array([0.0, 0.5], np.float32),        # norm 0.5
             "b": np.array([[6.0, 8.0]], np.float32)}      # norm 10
    out = calibrate(stored, fresh)
    np.testing.assert_allclose(out["a"], [0.0, 5.0])       # 5 * (0, 1)
    np.testing.assert_allclose(out["b"], [[1.2, 1.6]])     # 2 * (0.6, 0.8)
    assert out["a"].dtype == np.float32


def test_zero_norm_gives_zero_not_nan():
    out = calibrate({"w": np.ones(3, np.float32)}, {"w": np.zeros(3, np.float32)})
    np.testing.assert_array_equal(out["w"], np.zeros(3))
    out = calibrate({"w": np.zeros(3, np.float32)}, {"w": np.ones(3, np.float32)})
    np.testing.assert_array_equal(out["w"], np.zeros(3))


def test_weighted_step_is_fedavg_of_updates():
    base = {"w": np.array([1.0, 1.0], np.float32)}
    ups = [{"w": np.array([1.0, 0.0], np.float32)}, {"w": np.array([0.0, 4.0], np.float32)}]
    out = weighted_step(base, ups, [30, 10])
    # 1 + (30*1 + 10*0)/40 = 1.75 ; 1 + (30*0 + 10*4)/40 = 2.0
    np.testing.assert_allclose(out["w"], [1.75, 2.0])


def test_skipped_round_keeps_model():
    base = {"w": np.array([1.0, 2.0], np.float32)}
    np.testing.assert_array_equal(weighted_step(base, [], [])["w"], base["w"])


def test_eq3_round_by_hand():
    # W'^{g-1} = 0; two retained clients with stored updates and new directions
    base = {"w": np.zeros(2, np.float32)}
    stored = [{"w": np.array([0.0, 2.0], np.float32)},
              {"w": np.array([1.0, 0.0], np.float32)}]
    fresh = [{"w": np.array([1.0, 0.0], np.float32)},
             {"w": np.array([0.0, -3.0], np.float32)}]
    cal = [calibrate(s, f) for s, f in zip(stored, fresh, strict=True)]
    out = weighted_step(base, cal, [1, 3])
    # client 1: 2*(1,0) = (2,0); client 2: 1*(0,-1) = (0,-1); (1*(2,0)+3*(0,-1))/4
    np.testing.assert_allclose(out["w"], [0.5, -0.75])


def test_mismatched_layers_raise():
    with pytest.raises(ValueError, match="layer names differ"):
        calibrate({"a": np.ones(1)}, {"b": np.ones(1)})
    with pytest.raises(ValueError, match="shape"):
        difference({"a": np.ones(2)}, {"a": np.ones(3)})
    with pytest.raises(ValueError, match="positive"):
        weighted_step({"a": np.ones(1)}, [{"a": np.ones(1)}], [0])

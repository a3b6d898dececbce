"""Alert rules on hand-made rows: what AnomalyTurbulence and AnomalyNan flag, and what they leave alone."""

from msprobe.core.monitor.alert import AnomalyDetector
from msprobe.core.monitor.alert_thresholds import TURBULENCE_WINDOW
from msprobe.core.monitor.config import AlertRule
from msprobe.core.monitor.records import MetricRow

OPS = ("norm", "min", "max", "mean", "nans", "zeros")


def row(step, norm, lo=-1.0, hi=1.0, mean=0.0, nans=0.0, zeros=0.0, name="fc.weight", tag="grad_reduced",
        dtype="torch.float32", shape=(2, 2)):
    return MetricRow(tag, name, step, None, [norm, lo, hi, mean, nans, zeros], shape, dtype)


def turbulence(threshold=0.5):
    return AnomalyDetector([AlertRule("AnomalyTurbulence", threshold)], OPS, rank=3)


def feed(det, norms, **kw):
    """One row per step with these norms; returns the (step, op) of every hit."""
    return [(h["step"], h["op"]) for step, n in enumerate(norms) for h in det.check_step([row(step, n, **kw)])]


def test_turbulence_is_against_the_largest_of_the_recent_values():
    det = turbulence(0.5)
    # steps 0-2 build the history (3 values needed); 1.4 <= 1.5 x 1.2 and a drop is no turbulence
    assert feed(det, [1.0, 1.2, 0.9, 1.4, 0.1]) == []
    hits = det.check_step([row(5, 1.5 * 1.4 * 1.01)])
    assert [(h["op"], h["step"], h["rank"], h["rule"]) for h in hits] == [("norm", 5, 3, "AnomalyTurbulence")]
    assert hits[0]["recent_max"] == 1.4 and hits[0]["tag_name"] == "0:fc.weight/rank3/grad_reduced"
    assert "the largest |value| of its last" in hits[0]["message"] and hits[0]["group_mates"] == [3]


def test_steady_growth_is_not_turbulence():
    # Adam's exp_avg_sq fills up like (1 - 0.999^t): each value a little above the last
    assert feed(turbulence(0.5), [0.001 * t for t in range(1, 20)]) == []
    # ... while the same jump in one step is
    assert feed(turbulence(0.5), [1.0, 1.0, 1.0, 1.0, 2.0]) == [(4, "norm")]


def test_window_forgets_old_peaks():
    old_peak = [10.0] + [1.0] * TURBULENCE_WINDOW          # the 10.0 falls out of the window
    assert feed(turbulence(0.5), old_peak + [9.0]) == [(len(old_peak), "norm")]
    assert feed(turbulence(0.5), old_peak[1:] + [10.0, 9.0]) == [(TURBULENCE_WINDOW, "norm")]


def test_no_verdict_before_three_values():
    assert feed(turbulence(0.5), [1.0, 100.0, 1e4]) == []


def test_zero_baselines_integers_and_near_zero_values_are_not_turbulence():
    det = turbulence(0.5)
    # a zero-initialised bias: 0, then moving away from zero; its history starts at the first non-zero
    assert feed(det, [0.0, 0.0, 0.0, 1e-3, 2e-3, 2.5e-3, 3e-3], name="fc.bias") == []
    # token ids: min 0, max and norm jumping with the batch
    det = turbulence(0.5)
    for step, hi in enumerate([3.0, 60.0, 2.0, 63.0, 1.0, 63.0]):
        assert det.check_step([row(step, hi * 10, lo=0.0, hi=hi, dtype="torch.int64")]) == []
    # the bias gradient of a conv ahead of BatchNorm: rounding noise next to the other gradients
    det = turbulence(0.5)
    for step, noise in enumerate([1e-8, 3e-9, 2e-8, 1e-8, 9e-8]):
        big = row(step, 1.0, name="conv.weight")
        assert det.check_step([big, row(step, noise, lo=-noise, hi=noise, name="conv.bias")]) == []


def test_min_and_max_judge_the_end_farther_from_zero():
    det = turbulence(0.5)
    # exp_avg_sq: min is its tiny low end and swings by orders of magnitude; max is steady
    for step, lo in enumerate([1e-10, 1e-9, 1e-10, 1e-9, 1e-7]):
        assert det.check_step([row(step, 1.0, lo=lo, hi=1e-5, tag="exp_avg_sq")]) == []
    # a gradient whose negative end blows up
    det = turbulence(0.5)
    hits = [(h["step"], h["op"]) for step, lo in enumerate([-1.0, -1.1, -0.9, -50.0])
            for h in det.check_step([row(step, 1.0, lo=lo, hi=1.0)])]
    assert hits == [(3, "min")]


def test_mean_and_counts_are_not_turbulence_and_series_are_separate():
    det = turbulence(0.5)
    for step in range(3):
        det.check_step([row(step, 1.0, mean=1e-9, zeros=0.1), row(step, 100.0, name="other")])
    assert det.check_step([row(3, 1.0, mean=5.0, zeros=0.9), row(3, 100.0, name="other")]) == []


def test_nan_rule_flags_nan_huge_values_and_nan_counts():
    det = AnomalyDetector([AlertRule("AnomalyNan", 1e10)], OPS, rank=0)
    hits = det.check_step([row(0, float("nan"), mean=float("nan"), nans=2.0), row(0, 3e10, name="b"),
                           row(0, 1.0, name="c")])
    assert sorted((h["tag_name"].split("/")[0], h["op"]) for h in hits) == [
        ("0:b", "norm"), ("0:fc.weight", "mean"), ("0:fc.weight", "nans"), ("0:fc.weight", "norm")]
    assert next(h for h in hits if h["op"] == "norm" and "fc" in h["tag_name"])["value"] == "nan"  # JSON-safe


def test_nan_values_stay_out_of_the_history():
    det = turbulence(0.5)
    feed(det, [2.0, 2.0, 2.0])
    det.check_step([row(3, float("nan"))])
    hits = det.check_step([row(4, 3.5)])
    assert len(hits) == 1 and hits[0]["recent_max"] == 2.0

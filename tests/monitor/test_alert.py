"""Alert rules on hand-made rows: what AnomalyTurbulence and AnomalyNan flag, and what they leave alone."""

import math

from msprobe.core.monitor.alert import AnomalyDetector
from msprobe.core.monitor.config import AlertRule
from msprobe.core.monitor.records import MetricRow

OPS = ("norm", "mean", "nans", "zeros")


def row(step, norm, mean=0.0, nans=0.0, zeros=0.0, name="fc.weight", tag="grad_reduced"):
    return MetricRow(tag, name, step, None, [norm, mean, nans, zeros], (2, 2), "torch.float32")


def test_turbulence_compares_with_the_mean_of_earlier_steps():
    det = AnomalyDetector([AlertRule("AnomalyTurbulence", 0.5)], OPS, rank=3)
    assert det.check_step([row(0, 1.0)]) == []            # no history yet
    assert det.check_step([row(1, 1.4)]) == []            # 1.4 <= 1.5 x 1.0
    assert det.check_step([row(2, 0.1)]) == []            # drops are not turbulence
    hits = det.check_step([row(3, 1.5 * (1.0 + 1.4 + 0.1) / 3 * 1.01)])
    assert [(h["op"], h["step"], h["rank"], h["rule"]) for h in hits] == [("norm", 3, 3, "AnomalyTurbulence")]
    assert math.isclose(hits[0]["history_mean"], 2.5 / 3)
    assert hits[0]["tag_name"] == "0:fc.weight/rank3/grad_reduced" and hits[0]["group_mates"] == [3]


def test_turbulence_ignores_mean_and_counts_and_series_are_separate():
    det = AnomalyDetector([AlertRule("AnomalyTurbulence", 0.5)], OPS, rank=0)
    det.check_step([row(0, 1.0, mean=1e-9, zeros=0.1), row(0, 100.0, name="other")])
    hits = det.check_step([row(1, 1.0, mean=5.0, zeros=0.9), row(1, 100.0, name="other")])
    assert hits == []                                        # mean x5e9 and zeros x9 are not magnitudes


def test_nan_rule_flags_nan_huge_values_and_nan_counts():
    det = AnomalyDetector([AlertRule("AnomalyNan", 1e10)], OPS, rank=0)
    hits = det.check_step([row(0, float("nan"), mean=float("nan"), nans=2.0), row(0, 3e10, name="b"),
                           row(0, 1.0, name="c")])
    assert sorted((h["tag_name"].split("/")[0], h["op"]) for h in hits) == [
        ("0:b", "norm"), ("0:fc.weight", "mean"), ("0:fc.weight", "nans"), ("0:fc.weight", "norm")]
    assert next(h for h in hits if h["op"] == "norm" and "fc" in h["tag_name"])["value"] == "nan"  # JSON-safe


def test_nan_values_stay_out_of_the_history():
    det = AnomalyDetector([AlertRule("AnomalyTurbulence", 0.5)], OPS, rank=0)
    det.check_step([row(0, 2.0)])
    det.check_step([row(1, float("nan"))])
    hits = det.check_step([row(2, 3.5)])
    assert len(hits) == 1 and hits[0]["history_mean"] == 2.0

"""MindSpore host statistics: the one-pass kernel and numpy agree; inf/nan keep numpy's answer."""

import numpy as np
import pytest

from msprobe.mindspore.statistics import array_stats


def _numpy(a):
    f = a.astype(np.float64).reshape(-1)
    return f.max(), f.min(), f.mean(), np.sqrt(np.dot(f, f))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_statistics_match_numpy(dtype):
    a = (np.random.default_rng(3).standard_normal((64, 300)) * 2 + 0.25).astype(dtype)
    rec = array_stats(a)
    mx, mn, mean, norm = _numpy(a)
    assert rec["Max"] == mx and rec["Min"] == mn
    assert rec["Mean"] == pytest.approx(mean, rel=1e-5, abs=1e-6)
    assert rec["Norm"] == pytest.approx(norm, rel=1e-5)


def test_non_finite_values_show_as_strings():
    a = np.ones(1000, dtype=np.float32)
    a[3] = np.nan
    assert array_stats(a)["Max"] == "nan"
    a[3] = -np.inf
    rec = array_stats(a)
    assert rec["Min"] == "-inf" and rec["Mean"] == "-inf" and rec["Max"] == 1.0

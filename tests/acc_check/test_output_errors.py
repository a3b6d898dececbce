"""The one-pass judge (output_errors.measure_errors) gives what the two reference functions give
(core.compare.metrics.tensor_metrics for the numbers acc_check reports, and verdict.ulp_error), row by
row of a table of outputs."""

import math

import numpy as np
import pytest
import torch

from msprobe.core.acc_check.output_errors import measure_errors
from msprobe.core.acc_check.verdict import ulp_error
from msprobe.core.compare.metrics import tensor_metrics

_G = np.random.default_rng(7)
_BENCH = _G.standard_normal(200_000)  # > 3 chunks of 65536, with a ragged last one
_BF16 = torch.from_numpy(_BENCH).to(torch.bfloat16).float().numpy()


def _with(a, index, value):
    a = a.copy()
    a[index] = value
    return a


CASES = [
    # (tested, bench, dtype, reduction length, input rms)
    (_BENCH.astype(np.float32), _BENCH, "float32", 1, 0.0),
    (_BF16, _BENCH, "bfloat16", 256, 1.5),  # bf16 rounding, error floor from a long reduction
    (_BENCH.astype(np.float16), _BENCH, "float16", 1, 0.0),  # float16 array as tested
    (_with(_BENCH.astype(np.float32), 123_456, 9.0), _BENCH, "float32", 1, 0.0),  # one bad element, 2nd chunk
    (np.zeros(1000, np.float32), _with(np.zeros(1000), 3, 1e-6), "float32", 1, 0.0),  # golden zeros: epsilon
    (np.zeros(10, np.float32), np.zeros(10), "float32", 1, 0.0),  # both all zeros: cosine 1
    (np.array([0.5], np.float32), np.array([0.50001]), "float32", 1, 0.0),  # one element: cosine undefined
    (np.float32(2.0), np.float64(2.0), "float32", 1, 0.0),  # 0-d
    (np.array([-3.0, 4.0], np.float32), np.array([3.0, 4.0]), "float32", 1, 0.0),  # opposite sign
    # the rest leave the one-pass path for the reference functions
    (_with(_BENCH.astype(np.float32), 70_000, np.nan), _with(_BENCH, 70_000, np.nan), "float32", 1, 0.0),
    (_with(_BENCH.astype(np.float32), 5, np.inf), _BENCH, "float32", 1, 0.0),  # inf only where tested
    (np.array([1, 2, 3]), np.array([1, 2, 4]), "int64", 1, 0.0),
    (np.array([1 + 1j, 2]), np.array([1 + 1j, 2.001]), "complex128", 1, 0.0),
    (np.zeros(0, np.float32), np.zeros(0), "float32", 1, 0.0),  # empty
    (np.ones(4, np.float32), np.ones(5), "float32", 1, 0.0),  # shapes differ
]


def _same(a, b):
    if isinstance(a, str):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == pytest.approx(b, rel=1e-12, abs=1e-300)


@pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")  # tensor_metrics on complex
@pytest.mark.parametrize("tested,bench,dtype,k,rms", CASES)
def test_one_pass_matches_the_reference_functions(tested, bench, dtype, k, rms):
    got = measure_errors(tested, bench, dtype, k, rms)
    if np.shape(tested) == np.shape(bench):
        assert _same(got.ulp_err, ulp_error(tested, bench, dtype, k, rms))
    else:  # ulp_error refuses it; the dtype verdict must still say error
        assert got.ulp_err == math.inf
    expected = tensor_metrics(tested, bench)
    for field in ("cosine", "max_abs_err", "max_rel_err", "message"):
        assert _same(getattr(got, field), getattr(expected, field)), (field, getattr(got, field))


def test_an_apis_outputs_flattened_in_order_with_their_compare_paths():
    from msprobe.core.acc_check.execution import flat_outputs
    a, b, c = np.zeros(2), np.ones(3), np.full(1, 2.0)
    out = (a, [b, (c, 7)], None, "text", 1.5)
    got = flat_outputs(out, np.ndarray, (bool, int, float))
    assert [(p, v if not isinstance(v, np.ndarray) else id(v)) for p, v in got] == [
        ("0", id(a)), ("1.0", id(b)), ("1.1.0", id(c)), ("1.1.1", 7), ("4", 1.5)]
    assert flat_outputs(a, np.ndarray, (int,)) == [("0", a)]  # a lone output is "0"
    assert flat_outputs(3 + 1j, np.ndarray, (bool, int, float)) == []  # not one of the framework's numbers

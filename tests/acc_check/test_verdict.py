"""Both verdicts on hand-made outputs: the seed rule (cosine > 0.99 and max abs < 1e-4) and the
dtype-aware rule (error in units of eps * (|bench| + sqrt(K) * rms))."""

import math

import numpy as np
import pytest
import torch

from msprobe.core.acc_check.reduction import backward_reduction_length, forward_reduction_length
from msprobe.core.acc_check.verdict import dtype_status, seed_status, ulp_error
from msprobe.core.compare.metrics import tensor_metrics


@pytest.mark.parametrize("tested,bench,status", [
    ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], "pass"),
    ([1.0, 2.0, 3.00005], [1.0, 2.0, 3.0], "pass"),       # abs err 5e-5 < 1e-4
    ([1.0, 2.0, 3.0002], [1.0, 2.0, 3.0], "error"),       # abs err 2e-4: cosine is fine, the error is not
    ([1.0, -2.0, 3.0], [1.0, 2.0, 3.0], "error"),         # cosine 0.43
    ([0.5], [0.50001], "pass"),                           # one element: cosine undefined, abs err decides
    ([np.nan, 1.0], [1.0, 1.0], "error"),                 # nan where the bench has none
])
def test_seed_rule(tested, bench, status):
    got, _ = seed_status(tensor_metrics(np.array(tested), np.array(bench)))
    assert got == status


def _matmul(dtype, k=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(32, k, generator=g).to(dtype)
    b = torch.randn(k, 32, generator=g).to(dtype)
    tested = (a @ b).float().numpy()
    bench = (a.double() @ b.double()).numpy()
    return tested, bench


def test_bf16_matmul_fails_the_seed_rule_but_passes_the_dtype_rule():
    tested, bench = _matmul(torch.bfloat16)
    status, _ = seed_status(tensor_metrics(tested, bench))
    assert status == "error"  # bf16 rounding of values ~16 is ~0.06, far above 1e-4
    ulp = ulp_error(tested, bench, "bfloat16", 256)
    assert ulp <= 1.0 and dtype_status(ulp, "bfloat16") == "pass"


def test_fp32_api_computing_in_fp16_fails_the_dtype_rule():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(32, 64, generator=g), torch.randn(64, 32, generator=g)
    good = (a @ b).numpy()
    bad = (a.half() @ b.half()).float().numpy()
    bench = (a.double() @ b.double()).numpy()
    assert dtype_status(ulp_error(good, bench, "float32", 64), "float32") == "pass"
    ulp_bad = ulp_error(bad, bench, "float32", 64)
    assert ulp_bad > 100 and dtype_status(ulp_bad, "float32") == "error"


def test_dtype_rule_edges():
    assert ulp_error(np.array([1, 2]), np.array([1, 2]), "int64", 1) == 0.0
    assert ulp_error(np.array([1, 3]), np.array([1, 2]), "int64", 1) == math.inf
    assert ulp_error(np.array([np.inf, 1.0]), np.array([np.inf, 1.0]), "float32", 1) == 0.0
    assert ulp_error(np.array([np.nan, 1.0]), np.array([2.0, 1.0]), "float32", 1) == math.inf
    assert ulp_error(np.zeros(4, np.float32), np.zeros(4), "float32", 1) == 0.0
    # half an ULP of float32 at 1.0, for a value as large as the rms: unit = eps * (1 + 1)
    one = np.array([1.0 + 2.0 ** -24], np.float64)
    assert ulp_error(np.array([1.0], np.float32), one, "float32", 1) == pytest.approx(0.25, rel=0.01)


def test_reduction_lengths():
    assert forward_reduction_length("linear", [(4, 8, 256), (768, 256), (768,)], (4, 8, 768)) == 256
    assert forward_reduction_length("matmul", [(2, 4, 16, 64), (2, 4, 64, 16)], (2, 4, 16, 16)) == 64
    assert forward_reduction_length("addmm", [(8,), (4, 32), (32, 8)], (4, 8)) == 32
    assert forward_reduction_length("conv2d", [(2, 3, 8, 8), (16, 3, 3, 3)], (2, 16, 8, 8)) == 27
    assert forward_reduction_length("sum", [(4, 100)], ()) == 400
    assert forward_reduction_length("softmax", [(4, 128)], (4, 128)) == 128
    assert forward_reduction_length("__add__", [(4, 8), (4, 8)], (4, 8)) == 1
    # a linear weight's gradient sums over the 32 rows of the batch
    assert backward_reduction_length("linear", [(32, 16), (8, 16)], [(32, 8)], (8, 16)) >= 32
    # the gradient of a broadcast bias sums over the broadcast rows
    assert backward_reduction_length("__add__", [(4, 8), (8,)], [(4, 8)], (8,)) == 4

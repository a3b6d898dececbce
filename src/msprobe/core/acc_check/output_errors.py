"""What acc_check reports of one compared output: cosine, max abs and relative error (as
core.compare.metrics defines them) and the dtype-aware ULP error (verdict.ulp_error), in one pass over
float64 chunks.

Judging is what a worker does besides running the API: one pass shares the float64 copy, the difference
and |bench| between the numbers, and skips what the CSVs do not show (Euclidean distance, thousandth
ratios). Finite floating outputs take this path; anything else
(inf/nan, integers, complex) goes to the two reference functions, which define the numbers. Guarded
by `benchmarks/acc_check_throughput.py`. Must not import torch or mindspore.
"""

import math
from dataclasses import dataclass

import numpy as np

from msprobe.core.acc_check import dtypes
from msprobe.core.acc_check.verdict import ulp_error
from msprobe.core.compare.metrics import REL_EPS, MetricAccumulator, tensor_metrics

CHUNK = 1 << 16  # elements per pass: the float64 buffers stay in cache between the sweeps over a chunk


@dataclass
class OutputErrors:
    """The numbers of one details row; what verdict.seed_status reads (cosine, max_abs_err, message)."""

    cosine: float
    max_abs_err: float
    max_rel_err: float
    ulp_err: float
    message: str = ""


def _errors(metrics, ulp):
    return OutputErrors(metrics.cosine, metrics.max_abs_err, metrics.max_rel_err, ulp, metrics.message)


def measure_errors(tested, bench, dtype, reduction_length, input_rms=0.0, chunk=CHUNK):
    """OutputErrors of a tested output against its float64 benchmark.

    Args:
        tested, bench: same-shaped arrays.
        dtype: canonical tested dtype ('float32', 'bfloat16', ...).
        reduction_length, input_rms: as verdict.ulp_error.

    Returns:
        The fields of `tensor_metrics(tested, bench)` that acc_check reports, and `ulp_error(tested,
        bench, dtype, ...)` (dot products here are BLAS sums, so cosine may differ in the last bits);
        shapes that differ give tensor_metrics' message and an infinite ULP error.
    """
    t, b = np.asarray(tested), np.asarray(bench)
    if t.shape != b.shape:
        return _errors(tensor_metrics(t, b, chunk=chunk), math.inf)
    fast = (t.size > 0 and t.dtype.kind == "f" and b.dtype == np.float64
            and dtypes.DTYPES.get(dtype, ("",))[0] == "float")
    result = _one_pass(t.reshape(-1), b.reshape(-1), dtype, reduction_length, input_rms, chunk) if fast else None
    if result is None:  # not a finite float pair: the reference functions handle every case
        return _errors(tensor_metrics(t, b, chunk=chunk), ulp_error(t, b, dtype, reduction_length, input_rms))
    return result


def _one_pass(t, b, dtype, reduction_length, input_rms, chunk):
    """None when an inf/nan turns up (the reference functions then start over)."""
    gg = float(np.dot(b, b))
    if not math.isfinite(gg):
        return None
    eps = dtypes.epsilon(dtype)
    tiny = 2.0 ** dtypes.min_normal_exponent(dtype)
    floor = max(math.sqrt(max(1, reduction_length)) * max(math.sqrt(gg / b.size), input_rms), tiny)
    acc = MetricAccumulator(n=t.size, gg=gg)  # gives cosine and its messages; other sums stay unused
    worst_ulp = 0.0
    bufs = [np.empty(min(chunk, t.size)) for _ in range(3)]
    for start in range(0, t.size, chunk):
        bc = b[start:start + chunk]
        x, d, ab = (buf[:bc.size] for buf in bufs)
        np.copyto(x, t[start:start + chunk], casting="unsafe")
        tt = float(np.dot(x, x))
        if not math.isfinite(tt):
            return None
        acc.tt += tt
        acc.dot += float(np.dot(x, bc))
        np.subtract(x, bc, out=d)
        np.abs(d, out=d)
        acc.max_abs = max(acc.max_abs, float(d.max()))
        np.abs(bc, out=ab)
        # dtype-aware units: |t - b| / (|b| + floor), as verdict.ulp_error
        np.add(ab, floor, out=x)
        np.divide(d, x, out=x)
        worst_ulp = max(worst_ulp, float(x.max()))
        # relative error with golden zeros on a tiny epsilon, as MetricAccumulator.update
        if ab.min() == 0.0:
            ab[ab == 0.0] = REL_EPS
        acc.max_rel = max(acc.max_rel, float(np.divide(d, ab, out=x).max()))
    return _errors(acc.result(), worst_ulp / eps)

"""Pass/error verdicts for one compared output.

Two verdicts, both written to the details CSV:

- the seed rule (column Status, the default): pass iff cosine > 0.99 and max abs error < 0.0001;
- the dtype-aware rule (trailing columns): every element's error, measured in units of
  eps(tested dtype) * (|bench| + sqrt(K) * rms), stays within ULP_ALLOWANCE units (4 for 16-bit floats, 16 for float32/64), where K is
  the reduction length (see reduction.py) and rms the larger of the RMS of the bench output and of
  the floating inputs (the outputs' gradients for backward). For an element of typical size
  (|bench| ~ rms, K = 1) one unit is 2 to 4 ULPs of its value; the sqrt(K)*rms term is the rounding a
  correct K-term sum in that dtype cannot avoid, and keeps elements near zero (cancellation) from
  counting as huge relative errors. A bf16 matmul passes it; an fp32 API that computes in fp16 inside
  does not.
  Integer and bool outputs must match exactly.

Must not import torch or mindspore.
"""

import math

import numpy as np

from msprobe.core.acc_check import dtypes

COSINE_MIN = 0.99
MAX_ABS_ERR = 1e-4
# Units of error allowed per tested dtype. Half-precision results are normally computed in float32
# and rounded once (<= 0.5 unit); float32/float64 transcendental kernels differ by library and are
# allowed a few bits (PyTorch's CPU float32 gelu alone reaches ~7).
ULP_ALLOWANCE = {"float16": 4.0, "bfloat16": 4.0, "float8_e4m3fn": 4.0, "float8_e5m2": 4.0}
DEFAULT_ULP_ALLOWANCE = 16.0

PASS, ERROR, SKIP = "pass", "error", "SKIP"


def seed_status(metrics):
    """(status, note) by the seed rule from a core.compare TensorMetrics or an OutputErrors."""
    cos, abs_err = metrics.cosine, metrics.max_abs_err
    if math.isnan(abs_err):
        if metrics.message == "empty tensor":
            return PASS, "empty tensor"
        return ERROR, metrics.message
    if math.isnan(cos):
        # cosine undefined (one element, or one side all zeros): the absolute error decides
        status = PASS if abs_err < MAX_ABS_ERR else ERROR
        return status, f"{metrics.message}; judged by max abs error" if metrics.message else ""
    return (PASS if cos > COSINE_MIN and abs_err < MAX_ABS_ERR else ERROR), ""


CHUNK = 1 << 16  # elements per pass: float64 temporaries of 512 KiB stay in cache (a 1M chunk does not)


def ulp_error(tested, bench, dtype, reduction_length, input_rms=0.0):
    """Largest per-element error in dtype-aware units (see the module docstring); inf on a mismatch
    of inf/nan positions or of integer values.

    Args:
        input_rms: RMS of the (floating) data flowing into the call; the error floor follows it too,
            since an elementwise function's rounding scales with its argument, not only its result.
    """
    t = np.asarray(tested).reshape(-1)
    b = np.asarray(bench).reshape(-1)
    if t.size == 0:
        return 0.0
    kind = dtypes.kind(dtype) if dtype in dtypes.DTYPES else "float"
    if kind in ("int", "bool"):
        return 0.0 if np.array_equal(t, b) else math.inf
    if kind == "complex":
        t, b = np.abs(t), np.abs(b)
    eps = dtypes.epsilon(dtype) if dtype in dtypes.DTYPES else dtypes.epsilon("float32")
    tiny = 2.0 ** dtypes.min_normal_exponent(dtype) if dtype in dtypes.DTYPES else 2.0 ** -126
    sq = float(np.dot(b, b)) if b.dtype.kind == "f" else float(np.dot(b.astype(np.float64), b.astype(np.float64)))
    if not math.isfinite(sq):
        return _ulp_error_nonfinite(t, b, eps, tiny, reduction_length, input_rms)
    floor = max(math.sqrt(max(1, reduction_length)) * max(math.sqrt(sq / b.size), input_rms), tiny)
    worst = 0.0
    for start in range(0, t.size, CHUNK):
        tc, bc = t[start:start + CHUNK], b[start:start + CHUNK]
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.subtract(tc, bc, dtype=np.float64)
        np.abs(diff, out=diff)
        unit = np.abs(bc, dtype=np.float64)
        unit += floor
        np.divide(diff, unit, out=diff)
        m = float(diff.max())
        if not m <= worst:  # larger, or nan: a non-finite tested value
            if not math.isfinite(m):
                return _ulp_error_nonfinite(t, b, eps, tiny, reduction_length, input_rms)
            worst = m
    return worst / eps


def _ulp_error_nonfinite(t, b, eps, tiny, reduction_length, input_rms):
    """inf/nan present: they must sit at the same places with the same values, then are left out."""
    t = t.astype(np.float64)
    b = b.astype(np.float64)
    t_bad, b_bad = ~np.isfinite(t), ~np.isfinite(b)
    same = (t_bad == b_bad) & ((t == b) | (np.isnan(t) & np.isnan(b)) | ~t_bad)
    if not same.all():
        return math.inf
    keep = ~(t_bad | b_bad)
    if not keep.any():
        return 0.0
    return _finite_ulp(t[keep], b[keep], eps, tiny, reduction_length, input_rms)


def _finite_ulp(t, b, eps, tiny, reduction_length, input_rms):
    rms = math.sqrt(float(np.dot(b, b)) / b.size)
    floor = max(math.sqrt(max(1, reduction_length)) * max(rms, input_rms), tiny)
    return float((np.abs(t - b) / (np.abs(b) + floor)).max()) / eps


def dtype_status(ulp_err, dtype):
    return PASS if ulp_err <= ULP_ALLOWANCE.get(dtype, DEFAULT_ULP_ALLOWANCE) else ERROR

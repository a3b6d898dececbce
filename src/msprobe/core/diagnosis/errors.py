"""The scale-free error of compared tensors, and what each dtype's precision explains of it.

Numbers only: no row names, no calls (see `calls.py`). Must not import torch or mindspore.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from msprobe.core.compare.dtypes import canonical_dtype
from msprobe.core.diagnosis.thresholds import (CROSS_FRAMEWORK_NOISE, DTYPE_NOISE_FLOOR, INTEGER_NOISE_FLOOR,
                                               ROUNDING_UNITS, UNIT_ROUNDOFF, UNKNOWN_DTYPE_NOISE_FLOOR)

INTEGER_DTYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})


def noise_floor(*dtypes):
    """The noise floor of a comparison between tensors of these dtypes (the coarser one wins)."""
    floors = []
    for d in dtypes:
        c = canonical_dtype(d)
        if c in DTYPE_NOISE_FLOOR:
            floors.append(DTYPE_NOISE_FLOOR[c])
        elif c in INTEGER_DTYPES:
            floors.append(INTEGER_NOISE_FLOOR)
        else:
            floors.append(UNKNOWN_DTYPE_NOISE_FLOOR)
    return max(floors) if floors else UNKNOWN_DTYPE_NOISE_FLOOR


def cross_framework(t_dtype, g_dtype):
    """Whether the two dtype names are spelled by different frameworks (MindSpore's `Float32` against
    PyTorch's `torch.float32`): then different kernels computed the two values."""
    return str(t_dtype).startswith("torch.") != str(g_dtype).startswith("torch.")


def unit_roundoff(dtype):
    """Unit roundoff of a float dtype name (any framework's spelling), 0.0 for others."""
    return UNIT_ROUNDOFF.get(canonical_dtype(dtype), 0.0)


@functools.lru_cache(maxsize=512)
def dtype_relation(t_dtype, g_dtype):
    """How a row's two dtypes relate: (kind, coarser target dtype or None).

    kind is "same", "integer" (both integer or bool, any widths: compared by value), "coarser" (the
    target float has less precision than golden's: the target rounds where golden does not), "finer"
    (the reverse) or "other" (float against integer, unknown names: a real dtype difference).
    """
    t, g = canonical_dtype(t_dtype), canonical_dtype(g_dtype)
    if t == g:
        return "same", None
    if t in INTEGER_DTYPES and g in INTEGER_DTYPES:
        return "integer", None
    ut, ug = UNIT_ROUNDOFF.get(t), UNIT_ROUNDOFF.get(g)
    if ut is None or ug is None:
        return "other", None
    return ("coarser", t) if ut > ug else ("finer", None)


def row_floor(t_dtype, g_dtype, working_u):
    """Relative error below which a row's two values count as the same: the golden dtype's noise floor,
    raised to the rounding the run's working precision (unit roundoff `working_u`, 0 without one)
    allows when the target holds the value in a coarser float."""
    kind, coarser = dtype_relation(str(t_dtype), str(g_dtype))
    floor = noise_floor(g_dtype) if kind != "integer" else INTEGER_NOISE_FLOOR
    if kind != "integer" and cross_framework(t_dtype, g_dtype):
        floor *= CROSS_FRAMEWORK_NOISE
    if kind == "coarser" and working_u:
        floor = max(floor, ROUNDING_UNITS * min(unit_roundoff(coarser), working_u))
    return floor


def row_error(target, golden, euc_dist=None, max_abs_err=None):
    """Scale-free error of one tensor and whether inf/nan differ (see `row_errors`).

    Args:
        target, golden: (max, min, mean, norm), floats or None when absent.
        euc_dist, max_abs_err: tensor-mode metrics, or None.

    Returns:
        (error, nonfinite_differs)
    """
    def arr(values):
        present = np.array([[v is not None for v in values]])
        return np.array([[math.nan if v is None else float(v) for v in values]]), present

    t, tp = arr(target)
    g, gp = arr(golden)
    nan = math.nan
    err, nonfinite = row_errors(t, tp, g, gp, np.array([nan if euc_dist is None else euc_dist]),
                                np.array([nan if max_abs_err is None else max_abs_err]))
    return float(err[0]), bool(nonfinite[0])


def row_errors(t, t_present, g, g_present, euc_dist, max_abs_err):
    """Scale-free errors of many tensors at once, and where inf/nan differ.

    Every term is a lower bound of the element-wise error measured against the golden tensor's size:
    |ΔNorm| / Norm and |ΔMax|, |ΔMin|, |ΔMean| over the golden range max(|Max|, |Min|); with tensor
    metrics also EucDist / Norm (relative L2 error) and MaxAbsErr / range. So statistics and tensor
    mode rank the same way, and an error of 1e-3 reads "a thousandth of the tensor's scale". A zero
    golden scale makes any difference a full error (1).

    Args:
        t, g: float arrays (n, 4) of max, min, mean, norm (NaN where absent or NaN);
        t_present, g_present: bool arrays (n, 4), False where the statistic is absent;
        euc_dist, max_abs_err: float arrays (n,), NaN where absent.

    Returns:
        (errors (n,), nonfinite_differs (n,) bool); errors are inf where inf/nan differ.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        t_bad = t_present & ~np.isfinite(t)
        g_bad = g_present & ~np.isfinite(g)
        both = t_present & g_present
        same_bad = (t == g) | (np.isnan(t) & np.isnan(g))
        nonfinite = (both & ((t_bad != g_bad) | (t_bad & g_bad & ~same_bad))).any(axis=1)
        fin = both & ~t_bad & ~g_bad
        g_abs = np.where(fin | (g_present & ~g_bad), np.abs(g), 0.0)
        scale = np.maximum(g_abs[:, 0], g_abs[:, 1])
        norm = np.abs(g[:, 3])
        terms = [np.where(fin[:, 3], _rel(np.abs(t[:, 3] - g[:, 3]), norm), 0.0),
                 np.where(fin[:, 3] & np.isfinite(euc_dist), _rel(euc_dist, norm), 0.0),
                 np.where(np.isfinite(max_abs_err), _rel(max_abs_err, scale), 0.0)]
        for k in range(3):
            terms.append(np.where(fin[:, k], _rel(np.abs(t[:, k] - g[:, k]), scale), 0.0))
        err = np.maximum.reduce(terms)
    err = np.where(nonfinite, np.inf, err)
    return err, nonfinite


def _rel(diff, scale):
    """diff / scale, with a zero scale giving 0 for no difference and 1 (a full error) otherwise."""
    return np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), np.where(diff == 0, 0.0, 1.0))

"""The scale-free error of compared tensors, computed from a compare table's statistics and metrics,
and the noise floor of each dtype. Numbers only: no row names, no calls (see diagnosis_rows).

Must not import torch or mindspore.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from msprobe.core.compare.diagnosis_thresholds import (DTYPE_NOISE_FLOOR, INTEGER_NOISE_FLOOR,
                                                      UNKNOWN_DTYPE_NOISE_FLOOR)
from msprobe.core.compare.dtypes import canonical_dtype

MISSING = {"", "N/A", "None", "none", "unsupported", "null"}
_NONFINITE_TEXT = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan,
                   "infinity": math.inf, "-infinity": -math.inf}
_INTEGER_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}


def number(value):
    """A table cell as float, None when missing, or the original string for non-numeric values."""
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    try:  # numpy scalars
        return float(value)
    except (TypeError, ValueError):
        pass
    text = str(value).strip()
    if text in MISSING:
        return None
    low = text.lower()
    if low in _NONFINITE_TEXT:
        return _NONFINITE_TEXT[low]
    if text.endswith("%"):
        try:
            return float(text[:-1]) / 100.0
        except ValueError:
            return text
    return text


@functools.lru_cache(maxsize=256)
def dtype_pair(t_dtype, g_dtype):
    """(noise floor, dtypes differ) of a row's two dtype strings; a table has only a handful."""
    return noise_floor(t_dtype, g_dtype), canonical_dtype(t_dtype) != canonical_dtype(g_dtype)


def noise_floor(*dtypes):
    """The noise floor of a comparison between tensors of these dtypes (the coarser one wins)."""
    floors = []
    for d in dtypes:
        c = canonical_dtype(d)
        if c in DTYPE_NOISE_FLOOR:
            floors.append(DTYPE_NOISE_FLOOR[c])
        elif c in _INTEGER_DTYPES:
            floors.append(INTEGER_NOISE_FLOOR)
        else:
            floors.append(UNKNOWN_DTYPE_NOISE_FLOOR)
    return max(floors) if floors else UNKNOWN_DTYPE_NOISE_FLOOR


def row_error(target, golden, euc_dist=None, max_abs_err=None):
    """Scale-free error of one tensor and whether inf/nan differ (see `row_errors`).

    Args:
        target, golden: (max, min, mean, norm), floats or None when absent.
        euc_dist, max_abs_err: tensor-mode metrics, or None.

    Returns:
        (error, nonfinite_differs)
    """
    t, tp = _floats_2d([target])
    g, gp = _floats_2d([golden])
    euc, _ = floats([euc_dist])
    mae, _ = floats([max_abs_err])
    err, nonfinite = row_errors(t, tp, g, gp, euc, mae)
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


def floats(values):
    """Float array and presence mask of table cells (None/'N/A' absent; 'inf', ' inf', 'nan' parsed)."""
    out = np.empty(len(values), dtype=np.float64)
    present = np.ones(len(values), dtype=bool)
    for i, v in enumerate(values):
        if type(v) is float:  # the common case first
            out[i] = v
            continue
        x = number(v)
        if isinstance(x, float):
            out[i] = x
        else:
            out[i] = np.nan
            present[i] = False
    return out, present


def _floats_2d(rows):
    cols = [floats([r[k] for r in rows]) for k in range(4)]
    return np.stack([c[0] for c in cols], axis=1), np.stack([c[1] for c in cols], axis=1)

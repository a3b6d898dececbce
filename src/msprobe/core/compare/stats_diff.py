"""Statistics-mode columns: Max/Min/Mean/L2norm differences and relative errors (msprobe-facts §8.4),
vectorised over the whole table. Relative errors are shown as `"x%"` strings like msProbe's; the
numeric fractions are returned too, for the Result rules.

Cell values: both sides absent (None) -> 0; one side absent -> "N/A"; a NaN involved -> "Nan"; equal
values (infinities included) -> 0; golden 0 with a difference -> "inf".
"""
from __future__ import annotations

import numpy as np

from msprobe.core.compare.columns import STAT_DIFFS, STAT_REL_ERRS
from msprobe.core.compare.frame import STAT_FIELDS
from msprobe.core.compare.float_text import float_reprs


def _percent_strings(rel):
    """`"x%"` of 100*rel for the finite non-zero entries; the caller fills the special cases."""
    out = np.empty(len(rel), dtype=object)  # not np.full: it is slow for objects
    out[:] = "0"
    idx = np.flatnonzero(np.isfinite(rel) & (rel != 0))
    out[idx] = float_reprs(rel[idx] * 100.0, "%")
    return out


def stat_diff_columns(t_stats, g_stats, matched):
    """Difference and relative-error columns.

    Args:
        t_stats, g_stats: dict field -> (float array, is-number mask) for target and paired golden rows.
        matched: bool array, rows that have a golden partner.

    Returns:
        (columns: dict column name -> object array, norm_rel: float array of |NormRelativeErr| as a
        fraction, NaN where undefined)
    """
    cols = {}
    norm_rel = None
    for field, diff_name, rel_name in zip(STAT_FIELDS, STAT_DIFFS, STAT_REL_ERRS):
        t, t_ok = t_stats[field]
        g, g_ok = g_stats[field]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            equal = (t == g) & t_ok & g_ok
            diff = np.where(equal, 0.0, t - g)
            rel = np.where(equal, 0.0, np.abs(diff / g))
        has_nan = t_ok & g_ok & (np.isnan(t) | np.isnan(g))
        both_none = ~t_ok & ~g_ok
        one_none = t_ok ^ g_ok

        d = diff.astype(object)
        d[equal] = 0
        d[has_nan] = "Nan"
        d[both_none] = 0
        d[one_none] = "N/A"
        r = _percent_strings(rel)
        r[equal | both_none] = "0"
        r[np.isinf(rel) & ~equal] = "inf"
        r[has_nan] = "Nan"
        r[one_none] = "N/A"
        d[~matched] = "N/A"
        r[~matched] = "N/A"
        cols[diff_name], cols[rel_name] = d, r
        if field == "norm":
            norm_rel = np.where(matched & t_ok & g_ok & ~has_nan, np.where(both_none, 0.0, rel), np.nan)
            norm_rel = np.where(both_none & matched, 0.0, norm_rel)
    return cols, norm_rel

"""Statistics-mode columns: Max/Min/Mean/L2norm differences and relative errors (msprobe-facts §8.4),
vectorised over the whole table. Relative errors are shown as `"x%"` strings like msProbe's; the cells are
rendered from typed arrays (`stat_differences`), which the Parquet parts hold, and the norm's fraction
goes to the Result rules.

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


def stat_differences(t_stats, g_stats, matched):
    """The differences and relative errors as the table shows them, typed.

    Args:
        t_stats, g_stats: dict field -> (float array, is-number mask) for target and paired golden rows.
        matched: bool array, rows that have a golden partner.

    Returns:
        (dict field -> (diff, rel, absent): float arrays of the difference and of the relative error as a
        fraction, NaN where a NaN statistic is involved ("Nan"), 0 where both sides are equal or both
        absent; `absent` the rows with nothing to compare ("N/A": one side absent, or no golden row);
        norm_rel: float array of |NormRelativeErr| as a fraction, NaN where undefined, for the rules)
    """
    out = {}
    norm_rel = None
    for field in STAT_FIELDS:
        t, t_ok = t_stats[field]
        g, g_ok = g_stats[field]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            equal = (t == g) & t_ok & g_ok
            diff = np.where(equal, 0.0, t - g)
            rel = np.where(equal, 0.0, np.abs(diff / g))
        has_nan = t_ok & g_ok & (np.isnan(t) | np.isnan(g))
        both_none = ~t_ok & ~g_ok
        absent = (t_ok ^ g_ok) | ~matched
        if field == "norm":
            norm_rel = np.where(matched & t_ok & g_ok & ~has_nan, np.where(both_none, 0.0, rel), np.nan)
            norm_rel = np.where(both_none & matched, 0.0, norm_rel)
        diff[both_none] = 0.0
        shown_rel = np.where(np.isnan(rel), 0.0, rel)  # -inf against inf: no number, shown as 0
        shown_rel[both_none] = 0.0
        shown_rel[has_nan] = np.nan
        out[field] = (diff, shown_rel, absent)
    return out, norm_rel


def stat_diff_columns(t_stats, g_stats, matched):
    """Difference and relative-error columns as the table shows them, rendered from `stat_differences`.

    Returns:
        (columns: dict column name -> object array, norm_rel: as `stat_differences`)
    """
    typed, norm_rel = stat_differences(t_stats, g_stats, matched)
    cols = {}
    for field, diff_name, rel_name in zip(STAT_FIELDS, STAT_DIFFS, STAT_REL_ERRS):
        diff, rel, absent = typed[field]
        d = diff.astype(object)
        d[diff == 0] = 0
        d[np.isnan(diff)] = "Nan"
        d[absent] = "N/A"
        r = _percent_strings(rel)
        r[np.isinf(rel)] = "inf"
        r[np.isnan(rel)] = "Nan"
        r[absent] = "N/A"
        cols[diff_name], cols[rel_name] = d, r
    return cols, norm_rel

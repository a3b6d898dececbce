"""The Result and Err_message columns (msprobe-facts §8.6), vectorised.

Row checks (dtype, shape, requires_grad, non-tensor values, inf/nan against finite, checksum) flag the
row itself. Input-vs-output checks look at all input (and parameter) rows of one API/module call
against its output rows and flag the call's first output row, where the error shows.
Worst level wins: error > warning > pass. Rows without a golden partner get "N/A"; rows whose tensor one
run never held (a compiled run's `fused_away` record) get "fused away".
"""
from __future__ import annotations

import json
import re
from itertools import repeat
from operator import is_not

import numpy as np

from msprobe.core.compare import columns as C
from msprobe.core.compare.dtypes import canonical_dtype, per_dtype_pair
from msprobe.core.naming import split_base, split_key

MSG_UNMATCHED = "no golden data matched"
MSG_DTYPE = "error: target and golden dtypes differ"
MSG_SHAPE = "error: target and golden shapes differ"
MSG_REQUIRES_GRAD = "error: requires_grad differs between target and golden"
MSG_SCALAR = "error: non-tensor argument values differ"
MSG_NONFINITE = "error: target max/min is inf or nan while the golden's are finite"
MSG_MD5 = "error: checksums differ"
MSG_STATS_ERROR = "error: inputs agree within 10% but an output's norm differs by more than 50%"
MSG_STATS_WARNING = "warning: an output's norm relative error is over 10 times the largest input's"
MSG_TENSOR_ERROR = ("error: inputs agree (one-thousandth ratio above 0.9) but an output's "
                    "one-thousandth ratio is below 0.1")
MSG_TENSOR_WARNING = "warning: the output's cosine is more than 0.1 below the inputs'"
RESULT_FUSED = "fused away"
MSG_FUSED = "fused away: a compiled run computes this tensor inside a fused kernel and never holds it"

_INT_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8"})


class Flags:
    """Ordered (message, row mask) pairs collected by the checks."""

    def __init__(self, n):
        self.n = n
        self.items = []

    def add(self, message, mask):
        mask = np.asarray(mask, dtype=bool)
        if mask.any():
            self.items.append((message, mask))


def _api_name(key):
    prefix, rest = split_base(split_key(key)[0])
    return None if prefix in ("Module", "Cell") else rest


# a key `{prefix}.{api}` (+ `.{n}.{direction}`...) of an exempt API holds `.{api}` followed by `.` or its
# end: only keys with such a piece are split (a million-row dump has hundreds of thousands of keys)
_EXEMPT_PIECE = re.compile(r"\.(?:%s)(?:\.|$)" % "|".join(
    map(re.escape, sorted(C.ALL_RULES_EXEMPT | C.INPUT_RULES_EXEMPT))))
_FUSED_PIECE = re.compile("|".join(map(re.escape, C.FUSED_NAME_PARTS)))


def exemptions(keys):
    """(all rules skipped, input rules skipped) masks from the API names of the rows' keys."""
    candidates = filter(_EXEMPT_PIECE.search, dict.fromkeys(keys))
    names = {k: _api_name(k) for k in candidates}
    all_ex = [k for k, n in names.items() if n in C.ALL_RULES_EXEMPT]
    in_ex = [k for k, n in names.items() if n in C.INPUT_RULES_EXEMPT]
    return _rows_of(keys, all_ex), _rows_of(keys, in_ex)


def _rows_of(keys, wanted):
    """bool array: rows whose key is in `wanted`."""
    import pandas as pd
    if not wanted:
        return np.zeros(len(keys), dtype=bool)
    return pd.Series(keys, dtype=object).isin(wanted).to_numpy()


def _fused(keys):
    """Rows of calls whose names mark a fused projection (their dtype/shape may differ by design)."""
    return _rows_of(keys, list(filter(_FUSED_PIECE.search, dict.fromkeys(keys))))


def _not_none(values):
    return np.fromiter(map(is_not, values, repeat(None)), dtype=bool, count=len(values))


def row_checks(flags, target, golden_rows, matched, cross_framework, t_minmax, g_minmax, t_has_stats):
    """Checks of each row on its own. `golden_rows` are the paired golden rows (aligned to target);
    `t_minmax`/`g_minmax` are (max, min) float arrays; `t_has_stats` marks target rows whose Max is a
    number (NaN included), as opposed to absent."""
    fused = _fused(target["key"].to_numpy(dtype=object))
    t_kind = target["kind"].to_numpy(dtype=object)
    g_kind = golden_rows["kind"].to_numpy(dtype=object)

    t_dt = target["dtype"].to_numpy(dtype=object)
    g_dt = golden_rows["dtype"].to_numpy(dtype=object)

    def same_dtype(a, b):
        ca, cb = canonical_dtype(a), canonical_dtype(b)
        return ca == cb or (cross_framework and ca in _INT_DTYPES and cb in _INT_DTYPES)

    dtype_differs = ~per_dtype_pair(t_dt, g_dt, same_dtype)
    flags.add(MSG_DTYPE, matched & dtype_differs & ~fused)
    shape_differs = target["shape"].to_numpy(dtype=object) != golden_rows["shape"].to_numpy(dtype=object)
    flags.add(MSG_SHAPE, matched & shape_differs & ~fused & (t_kind == "tensor"))

    t_rg = target["requires_grad"].to_numpy(dtype=object)
    g_rg = golden_rows["requires_grad"].to_numpy(dtype=object)
    both_rg = _not_none(t_rg) & _not_none(g_rg)
    flags.add(MSG_REQUIRES_GRAD, matched & both_rg & (t_rg != g_rg))

    scalar = matched & (t_kind == "scalar") & (g_kind == "scalar")
    if scalar.any():
        tv = target["max"].to_numpy(dtype=object)
        gv = golden_rows["max"].to_numpy(dtype=object)
        idx = np.flatnonzero(scalar)
        differs = np.zeros(flags.n, dtype=bool)
        differs[idx] = [not _same_value(tv[i], gv[i]) for i in idx]
        flags.add(MSG_SCALAR, differs)

    (t_max, t_min), (g_max, g_min) = t_minmax, g_minmax
    with np.errstate(invalid="ignore"):
        t_bad = ~np.isfinite(t_max) | ~np.isfinite(t_min)
        g_fine = np.isfinite(g_max) & np.isfinite(g_min)
    flags.add(MSG_NONFINITE, matched & (t_kind == "tensor") & (g_kind == "tensor") & t_bad & g_fine & t_has_stats)


def _same_value(a, b):
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


def _group_reduce(codes, values, mask, how):
    """Per-group reduction of `values` over rows in `mask`: Series code -> value (NaNs ignored), codes
    ascending."""
    import pandas as pd
    sel = mask & ~np.isnan(values)
    if not sel.any():
        return pd.Series(dtype=np.float64)
    order = np.argsort(codes[sel], kind="stable")
    c, v = codes[sel][order], values[sel][order]
    starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    reduce = np.maximum if how == "max" else np.minimum
    return pd.Series(reduce.reduceat(v, starts), index=c[starts])


def _call_codes(keys):
    """Code of each row's call (its key), numbered in order of first appearance."""
    import pandas as pd
    keys = np.asarray(keys, dtype=object)
    new = np.ones(len(keys), dtype=bool)
    new[1:] = keys[1:] != keys[:-1]
    starts = keys[new].tolist()
    if len(dict.fromkeys(starts)) == len(starts):  # each call's rows adjacent, as rows.py lays them out
        return np.cumsum(new) - 1
    return pd.factorize(pd.Series(keys, dtype=object))[0]


def io_checks(flags, mode, keys, roles, matched, all_exempt, input_exempt, metrics):
    """Input-vs-output checks of each call; flags land on its first output row.

    Args:
        metrics: statistics mode: {"norm_rel": fraction array}; tensor mode: {"cosine", "one_k"} arrays.
    """
    import pandas as pd
    codes = _call_codes(keys)
    is_in = (roles == "input") & matched & ~all_exempt & ~input_exempt
    is_out = (roles == "output") & matched & ~all_exempt & ~input_exempt
    if not is_out.any():
        return
    out_rows = np.flatnonzero(is_out)
    out_calls, first = np.unique(codes[out_rows], return_index=True)
    first_out = pd.Series(out_rows[first], index=out_calls)
    error = np.zeros(flags.n, dtype=bool)
    warning = np.zeros(flags.n, dtype=bool)
    if mode == "statistics":
        rel = metrics["norm_rel"]
        in_max = _group_reduce(codes, rel, is_in, "max")
        out_max = _group_reduce(codes, rel, is_out, "max")
        both = in_max.index.intersection(out_max.index)
        i, o = in_max[both].to_numpy(), out_max[both].to_numpy()
        err = (i < C.STATS_ERROR_INPUT_MAX) & (o > C.STATS_ERROR_OUTPUT_MIN)
        warn = ((i > 0) & (o > C.STATS_WARN_RATIO * i)) | ((i == 0) & (o > C.STATS_WARN_ZERO_INPUT))
        error[first_out[both[err]].to_numpy()] = True
        warning[first_out[both[warn & ~err]].to_numpy()] = True
        flags.add(MSG_STATS_ERROR, error)
        flags.add(MSG_STATS_WARNING, warning)
    elif mode == "tensor":
        one_k, cos = metrics["one_k"], metrics["cosine"]
        in_1k, out_1k = _group_reduce(codes, one_k, is_in, "min"), _group_reduce(codes, one_k, is_out, "min")
        both = in_1k.index.intersection(out_1k.index)
        err = (in_1k[both].to_numpy() > C.TENSOR_ERROR_INPUT_1E3) & (out_1k[both].to_numpy() < C.TENSOR_ERROR_OUTPUT_1E3)
        error[first_out[both[err]].to_numpy()] = True
        in_cos, out_cos = _group_reduce(codes, cos, is_in, "min"), _group_reduce(codes, cos, is_out, "min")
        both_c = in_cos.index.intersection(out_cos.index)
        ic, oc = in_cos[both_c].to_numpy(), out_cos[both_c].to_numpy()
        warn = (ic > C.TENSOR_WARN_INPUT_COSINE) & (ic - oc > C.TENSOR_WARN_COSINE_DROP)
        warning[first_out[both_c[warn]].to_numpy()] = True
        flags.add(MSG_TENSOR_ERROR, error)
        flags.add(MSG_TENSOR_WARNING, warning & ~error)


def result_columns(flags, matched, mode, all_exempt, extra_messages=None):
    """(Result, Err_message) object arrays from the collected flags.

    Args:
        extra_messages: optional object array of per-row notes (e.g. a missing tensor file) that do
            not change the level.
    """
    n = flags.n
    level = np.zeros(n, dtype=np.int8)  # 0 pass, 1 warning, 2 error
    for message, mask in flags.items:
        mask = mask & ~all_exempt
        level = np.maximum(level, np.where(mask, 2 if message.startswith("error") else 1, 0).astype(np.int8))
    result = np.array(["pass", "warning", "error"], dtype=object)[level]
    unmatched_level = "warning" if mode == "md5" else "N/A"
    result[~matched] = unmatched_level

    # which messages each row has, as bits: rows with the same messages share one json text
    bits = (~matched).astype(np.int64)
    for k, (_, mask) in enumerate(flags.items):
        bits |= (mask & ~all_exempt).astype(np.int64) << (k + 1)
    has_extra = np.zeros(n, dtype=bool)
    if extra_messages is not None:
        has_extra = np.array([bool(m) for m in extra_messages], dtype=bool)
    err = np.empty(n, dtype=object)  # not np.full: it is slow for objects
    err[:] = "[]"

    def messages(i):
        msgs = [] if matched[i] else [MSG_UNMATCHED]
        return msgs + [m for m, mask in flags.items if mask[i] and not all_exempt[i]]

    plain = np.flatnonzero((bits != 0) & ~has_extra)
    if len(plain):
        codes, first, inverse = np.unique(bits[plain], return_index=True, return_inverse=True)
        texts = np.array([json.dumps(messages(plain[f])) for f in first], dtype=object)
        err[plain] = texts[inverse]
    for i in np.flatnonzero(has_extra):
        err[i] = json.dumps(messages(i) + [extra_messages[i]])
    return result, err


def mark_fused(result, err, t_fused, g_fused, matched):
    """Rows whose tensor one run never held (`fused_away` in its record; bool arrays, the golden one
    aligned to target rows): "fused away", not a verdict on values that do not exist. Returns the mask."""
    fused = t_fused | (matched & g_fused)
    if fused.any():
        result[fused] = RESULT_FUSED
        err[fused] = json.dumps([MSG_FUSED])
    return fused


class Verdicts:
    """The rows' verdicts, typed: `result` (pass, warning, error, N/A or fused away per row: what the
    Result column shows) and `messages(i)` (the list the Err_message column shows as JSON)."""

    def __init__(self, result, flags, matched, all_exempt, extra_messages=None, fused=None):
        self.result = result
        self._flags, self._matched, self._exempt = flags.items, matched, all_exempt
        self._extra, self._fused = extra_messages, fused

    def __len__(self):
        return len(self.result)

    @property
    def any_error(self):
        return bool((self.result == "error").any())

    def counts(self):
        """{"error": n, "warning": n, "pass": n, "N/A": n}, the verdicts present, in that order."""
        values, counts = np.unique(self.result.astype(str), return_counts=True)
        found = dict(zip(values.tolist(), counts.tolist()))
        return {k: int(found[k]) for k in ("error", "warning", "pass", "N/A") if k in found}

    def messages(self, i):
        if self._fused is not None and self._fused[i]:
            return [MSG_FUSED]
        msgs = [] if self._matched[i] else [MSG_UNMATCHED]
        msgs += [m for m, mask in self._flags if mask[i] and not self._exempt[i]]
        if self._extra is not None and self._extra[i]:
            msgs.append(self._extra[i])
        return msgs

"""Assemble the result table of one (target, golden) rank pair in msProbe's column layout
(msprobe-facts §8.5) from the pair's typed rows (`frame.PairedRows`). Values stay Python/numpy values
(None, floats, "x%" strings); `writer.py` renders them to csv/xlsx. The table is for display: nothing
reads its cells back but `table_reader.py`, for tables msProbe wrote.
"""
from __future__ import annotations

from itertools import repeat
from operator import is_

import numpy as np

from msprobe.core.compare import columns as C
from msprobe.core.compare import verdict as V
from msprobe.core.compare.frame import STAT_FIELDS, columns_frame
from msprobe.core.compare.stats_diff import stat_diff_columns


def _take(values, gidx, fill="N/A"):
    """Golden values aligned to target rows; `fill` where unpaired."""
    values = np.asarray(values, dtype=object)
    out = np.empty(len(gidx), dtype=object)  # not np.full: it fills an object array element by element
    out[:] = fill
    m = gidx >= 0
    out[m] = values[gidx[m]]
    return out


def _is_none(values):
    """bool array: which entries are None (one C-level pass)."""
    values = np.asarray(values, dtype=object)
    return np.fromiter(map(is_, values, repeat(None)), dtype=bool, count=len(values))


def _requires_grad_display(values):
    out = np.asarray(values, dtype=object).copy()
    out[_is_none(out)] = "N/A"
    return out


def requires_grad_consistent(t_rg, g_rg):
    """bool array: the two sides' requires_grad agree, or one of them is unknown (None)."""
    with np.errstate(all="ignore"):
        return _is_none(t_rg) | _is_none(g_rg) | np.asarray(t_rg == g_rg, dtype=bool)


def build_table(p, mode, *, cross_framework=False, stack=None, tensor_metrics=None):
    """The result DataFrame; the rows' verdicts, typed, go on `p.verdicts` (verdict.Verdicts).

    Args:
        p: the pair's `frame.PairedRows`.
        mode: "tensor", "statistics", "md5" or "structure".
        cross_framework: dumps of different frameworks (integer widths are not compared).
        stack: key -> list of stack lines; adds NPU_Stack_Info on the first row of each call.
        tensor_metrics: tensor mode: dict with float arrays "cosine", "euc", "max_abs", "max_rel",
            "one_k", "five_k", object array "display" (metric cell values) and "messages".
    """
    target, golden, gidx = p.target, p.golden_rows, p.gidx
    matched, g = p.matched, p.golden
    cols = {
        C.NPU_NAME: target["name"].to_numpy(dtype=object),
        C.BENCH_NAME: _take(golden["name"], gidx),
        "NPU Dtype": target["dtype"].to_numpy(dtype=object),
        "Bench Dtype": _take(golden["dtype"], gidx),
        "NPU Tensor Shape": target["shape"].to_numpy(dtype=object),
        "Bench Tensor Shape": _take(golden["shape"], gidx),
        "NPU Requires_grad": _requires_grad_display(target["requires_grad"]),
        "Bench Requires_grad": np.where(matched, _requires_grad_display(g["requires_grad"]), "N/A").astype(object),
    }
    flags = V.Flags(len(target))
    all_ex, in_ex = V.exemptions(target["key"].to_numpy(dtype=object))
    V.row_checks(flags, target, g, matched, cross_framework,
                 (p.t_num["max"][0], p.t_num["min"][0]), (p.g_num["max"][0], p.g_num["min"][0]), p.t_num["max"][1])
    roles = target["role"].to_numpy(dtype=object)
    keys = target["key"].to_numpy(dtype=object)
    extra = None
    if mode == "statistics":
        diff_cols, norm_rel = stat_diff_columns(p.t_num, p.g_num, matched)
        cols.update(diff_cols)
        V.io_checks(flags, mode, keys, roles, matched, all_ex, in_ex, {"norm_rel": norm_rel})
    elif mode == "tensor":
        cols.update(tensor_metrics["display"])
        extra = tensor_metrics["messages"]
        V.io_checks(flags, mode, keys, roles, matched, all_ex, in_ex,
                    {"one_k": tensor_metrics["one_k"], "cosine": tensor_metrics["cosine"]})
    elif mode == "md5":
        t_md5 = np.array([v if isinstance(v, str) else "N/A" for v in target["md5"]], dtype=object)
        g_md5 = np.array([v if isinstance(v, str) else "N/A" for v in g["md5"]], dtype=object)
        g_md5[~matched] = "N/A"
        cols["NPU MD5"], cols["BENCH MD5"] = t_md5, g_md5
        flags.add(V.MSG_MD5, matched & (t_md5 != g_md5) & (t_md5 != "N/A") & (g_md5 != "N/A"))
    if mode in ("statistics", "tensor"):
        for f, name in zip(STAT_FIELDS, C.NPU_STATS):
            cols[name] = target[f].to_numpy(dtype=object)
        for f, name in zip(STAT_FIELDS, C.BENCH_STATS):
            cols[name] = _take(golden[f], gidx)
    same_rg = requires_grad_consistent(target["requires_grad"].to_numpy(dtype=object),
                                       g["requires_grad"].to_numpy(dtype=object))
    cols[C.REQUIRES_GRAD_CONSISTENT] = same_rg.astype(object)
    cols[C.RESULT], cols[C.ERR_MESSAGE] = V.result_columns(flags, matched, mode, all_ex, extra)
    if mode == "tensor" and "unreadable" in tensor_metrics:
        cols[C.RESULT][tensor_metrics["unreadable"]] = "N/A"  # nothing was compared: never "pass"
    fused = V.mark_fused(cols[C.RESULT], cols[C.ERR_MESSAGE], target["fused"].to_numpy(dtype=bool),
                         g["fused"].to_numpy(dtype=bool), matched)
    p.verdicts = V.Verdicts(cols[C.RESULT], flags, matched, all_ex, extra, fused)

    ordered = list(C.MODE_COLUMNS[mode])
    if stack is not None:
        cols[C.STACK] = _stack_column(keys, stack)
        ordered.append(C.STACK)
    if mode == "tensor":
        t_files = target["data_name"].to_numpy(dtype=object)
        g_files = _take(golden["data_name"], gidx, fill=None)
        cols[C.DATA_NAME] = np.array([str([a or "-1", b or "-1"]) for a, b in zip(t_files, g_files)], dtype=object)
        ordered.append(C.DATA_NAME)
    return columns_frame({c: cols[c] if isinstance(cols[c], np.ndarray) else np.asarray(cols[c], dtype=object)
                          for c in ordered})


def _stack_column(keys, stack):
    out = np.full(len(keys), "N/A", dtype=object)
    if not stack:
        return out
    seen = set()
    for i, k in enumerate(keys):
        if k not in seen:
            seen.add(k)
            lines = stack.get(k)
            if lines:
                out[i] = str(list(lines))
    return out

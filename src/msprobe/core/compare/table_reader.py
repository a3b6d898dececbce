"""Compare result tables read back into typed rows: a user's existing msProbe CSV (or one of ours) can be
diagnosed and drawn like a fresh compare.

This is the one place that parses table cells: flattened row names back into record keys and roles,
`" inf"`, `"N/A"` and `"x%"` back into numbers, shape cells into dimensions, Err_message back into what it
says. Everything else reads the typed rows compare builds. Must not import torch or mindspore.
"""
from __future__ import annotations

import math
import re

import numpy as np

from msprobe.core.compare import columns as C
from msprobe.core.compare.frame import columns_frame

# Flattened row names (msprobe-facts §3.3): key + .input/.output/.parameters + slot, or a
# parameters_grad key + parameter name, or a debug key + nested index.
_PARAM_GRAD_RE = re.compile(r"^(?P<key>.+\.parameters_grad\.\d+)(?P<suffix>\..+)$")
_MODULE_RE = re.compile(r"^(?P<key>(?:Module|Cell)\..+?\.(?:forward|backward)\.\d+)"
                        r"(?P<suffix>\.(?P<role>input|output|parameters)(?:\..+)?)$")
_API_RE = re.compile(r"^(?P<key>.+?\.\d+\.(?:forward|backward))(?P<suffix>\.(?P<role>input|output)(?:\..+)?)$")
_DEBUG_RE = re.compile(r"^(?P<key>.+?\.\d+\.debug)(?P<suffix>(?:\..+)?)$")

_DIMS_RE = re.compile(r"^\[\s*(\d+(?:\s*,\s*\d+)*)?\s*,?\s*\]$")
MISSING = {"", "N/A", "None", "none", "unsupported", "null", "nan"}
_NONFINITE_TEXT = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan,
                   "infinity": math.inf, "-infinity": -math.inf}


def split_row_name(name):
    """(call key, name suffix, rows.py role) of a flattened row name, or None when it is not one.

    >>> split_row_name("Functional.linear.3.forward.input.1")
    ('Functional.linear.3.forward', '.input.1', 'input')
    >>> split_row_name("Module.fc.Linear.forward.0.parameters.weight")
    ('Module.fc.Linear.forward.0', '.parameters.weight', 'input')
    >>> split_row_name("Module.fc.Linear.parameters_grad.0.bias")
    ('Module.fc.Linear.parameters_grad.0', '.bias', 'grad')
    """
    m = _PARAM_GRAD_RE.match(name)
    if m:
        return m["key"], m["suffix"], "grad"
    m = _MODULE_RE.match(name) or _API_RE.match(name)
    if m:
        return m["key"], m["suffix"], "input" if m["role"] == "parameters" else m["role"]
    m = _DEBUG_RE.match(name)
    if m:
        return m["key"], m["suffix"], "debug"
    return None


def number(value):
    """A table cell as float, None when missing, or the original string for non-numeric values."""
    if value is None:
        return None
    if isinstance(value, (bool, int, float)):
        return None if isinstance(value, float) and math.isnan(value) else float(value)
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


def dims(cell):
    """A shape cell ("[4, 64]") as a tuple of dimensions, None when it is not one.

    >>> dims("[4, 64]"), dims("[]"), dims("None")
    ((4, 64), (), None)
    """
    m = _DIMS_RE.match(cell.strip()) if isinstance(cell, str) else None
    if m is None:
        return None
    return tuple(int(d) for d in m.group(1).split(",")) if m.group(1) else ()


def _is_tensor_dtype(dtype):
    text = "" if dtype is None else str(dtype)
    return bool(text) and text not in MISSING and not text.startswith("<class")


def _stat_cell(v):
    """A statistics cell as the row tables hold it: float (NaN for "nan"), None when absent, else text."""
    x = number(v)
    if x is None and isinstance(v, str) and v.strip().lower() == "nan":
        return math.nan
    if x is None and isinstance(v, float) and math.isnan(v):
        return math.nan
    return x


def _side_frame(table, names, dtype_col, shape_col, stat_cols, md5_col):
    """One side's row table (rows.COLUMNS + FLOAT_COLUMNS) from its columns of a compare table."""
    n = len(table)
    parts = [split_row_name(str(x)) for x in names]
    dtypes = table[dtype_col].to_numpy(dtype=object) if dtype_col in table.columns else np.full(n, None)
    kinds = np.array(["tensor" if _is_tensor_dtype(d) else "scalar" for d in dtypes], dtype=object)
    shapes = (table[shape_col].to_numpy(dtype=object) if shape_col in table.columns
              else np.full(n, "None", dtype=object)).astype(str).astype(object)
    shape_dims = {s: dims(s) for s in set(shapes.tolist())}
    cols = {"name": np.asarray(names, dtype=object),
            "key": np.array([p[0] if p else None for p in parts], dtype=object),
            "suffix": np.array([p[1] if p else "" for p in parts], dtype=object),
            "role": np.array([p[2] if p else "input" for p in parts], dtype=object),
            "kind": kinds, "dtype": np.array([str(d) for d in dtypes], dtype=object),
            "shape": shapes, "dims": np.fromiter(map(shape_dims.get, shapes.tolist()), dtype=object, count=n),
            "requires_grad": np.full(n, None, dtype=object),
            "md5": (table[md5_col].to_numpy(dtype=object) if md5_col in table.columns
                    else np.full(n, None, dtype=object)),
            "data_name": np.full(n, None, dtype=object), "fused": np.zeros(n, dtype=bool)}
    for f, c in zip(("max", "min", "mean", "norm"), stat_cols):
        raw = table[c].to_numpy(dtype=object) if c in table.columns else np.full(n, None, dtype=object)
        vals = np.array([_stat_cell(v) for v in raw], dtype=object)
        cols[f] = vals
        cols["f" + f] = np.array([v if isinstance(v, float) else math.nan for v in vals], dtype=np.float64)
    return columns_frame(cols)


def result_from_table(table, mode=None, step=0, rank=0, is_proc=False):
    """A CompareResult holding the typed rows of a compare table (ours or msProbe's csv/xlsx).

    Args:
        table: pandas.DataFrame with msProbe's compare columns (any mode).
        mode: "tensor", "statistics", "md5" or "structure"; defaults to what the columns say.
        step, rank, is_proc: where the table came from.

    Returns:
        CompareResult whose `table` keeps only the rows with a record name (what the rows describe).
    """
    from msprobe.core.compare.engine import CompareResult
    from msprobe.core.compare.frame import PairedRows

    names = table[C.NPU_NAME].to_numpy(dtype=object) if C.NPU_NAME in table.columns else np.array([], dtype=object)
    keep = np.array([split_row_name(str(x)) is not None for x in names], dtype=bool)
    table = table[keep].reset_index(drop=True) if len(table) else table.iloc[:0]
    names = names[keep]
    bench = table[C.BENCH_NAME].to_numpy(dtype=object) if C.BENCH_NAME in table.columns else np.full(len(table), None)
    messages = (table[C.ERR_MESSAGE].astype(str).to_numpy(dtype=object) if C.ERR_MESSAGE in table.columns
                else np.full(len(table), "", dtype=object))
    matched = np.array([number(b) is not None and "No bench data matched" not in m and "no golden data matched" not in m
                        for b, m in zip(bench, messages)], dtype=bool)
    target = _side_frame(table, names, "NPU Dtype", "NPU Tensor Shape", C.NPU_STATS, "NPU MD5")
    golden = _side_frame(table, np.where(matched, bench, names), "Bench Dtype", "Bench Tensor Shape",
                         C.BENCH_STATS, "BENCH MD5")
    gidx = np.where(matched, np.arange(len(table)), -1).astype(np.int64)
    metrics = None
    if "Cosine" in table.columns:
        metrics = {k: np.array([_float(v) for v in table[c]], dtype=np.float64)
                   for k, c in zip(("cosine", "euc", "max_abs", "max_rel", "one_k", "five_k"), C.TENSOR_METRICS)
                   if c in table.columns}
        metrics["nonfinite_moved"] = np.array(["different positions" in m for m in messages], dtype=bool)
    if mode is None:
        mode = ("tensor" if "Cosine" in table.columns else "md5" if "NPU MD5" in table.columns
                else "statistics" if "NPU max" in table.columns else "structure")
    stacks = {}
    if C.STACK in table.columns:
        for key, cell in zip(target["key"], table[C.STACK]):
            lines = _stack_lines(cell)
            if lines and key not in stacks:
                stacks[key] = lines
    return CompareResult(step=step, rank=rank, mode=mode, table=table, target_dir="", golden_dir="",
                         is_proc=is_proc, rows=PairedRows(target, golden, gidx, metrics), stacks=stacks)


def _float(v):
    x = number(v)
    return x if isinstance(x, float) else math.nan


def _stack_lines(cell):
    import ast
    if isinstance(cell, (list, tuple)):
        return [str(x) for x in cell]
    if isinstance(cell, str) and cell.startswith("["):
        try:
            value = ast.literal_eval(cell)
        except (ValueError, SyntaxError):
            return []
        return [str(x) for x in value] if isinstance(value, (list, tuple)) else []
    return []

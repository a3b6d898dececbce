"""Compare-table rows grouped into calls, each row reduced to one relative error and its flags.

The diagnosis needs, per API or module call in execution order, how far each input and each output
is off. This module turns a compare table (msProbe's columns, any mode) into that: `Call` objects in
table order (= dump order = execution order), with `Row`s holding a scale-free error, the noise floor
of the row's dtypes and flags for what no error number says (dtype changed, inf/nan appeared, a scalar
argument changed, shape changed); the numbers come from diagnosis_errors. Must not import torch or
mindspore.
"""
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field

import numpy as np

from msprobe.core.compare.diagnosis_errors import MISSING, dtype_pair, floats, number, row_errors

# Flattened row names (msprobe-facts §3.3): key + .input/.output/.parameters + slot, or a
# parameters_grad key + parameter name, or a debug key + nested index.
_PARAM_GRAD_RE = re.compile(r"^(?P<key>.+\.parameters_grad\.\d+)\.(?P<slot>.+)$")
_MODULE_RE = re.compile(r"^(?P<key>(?:Module|Cell)\..+?\.(?:forward|backward)\.\d+)\."
                        r"(?P<role>input|output|parameters)(?:\.(?P<slot>.+))?$")
_API_RE = re.compile(r"^(?P<key>.+?\.\d+\.(?:forward|backward))\.(?P<role>input|output)(?:\.(?P<slot>.+))?$")
_DEBUG_RE = re.compile(r"^(?P<key>.+?\.\d+\.debug)(?:\.(?P<slot>.+))?$")

# Flags: reasons a row diverges that are not (only) a number.
DTYPE, NONFINITE, ARGUMENT, SHAPE, CHECKSUM = "dtype", "nonfinite", "argument", "shape", "checksum"


@dataclass
class Row:
    """One tensor (or scalar argument) of one call, compared target vs golden."""

    name: str
    role: str                 # "input" (args, kwargs, parameters; grads of outputs in backward) or "output"
    slot: str                 # "0", "dim", "weight", "1.0" ...
    is_tensor: bool
    is_parameter: bool
    matched: bool
    target_dtype: str
    golden_dtype: str
    numel: int | None
    target: tuple             # (max, min, mean, norm) of the target run, floats or None
    golden: tuple
    error: float = 0.0        # scale-free relative error, 0 = identical (see row_error)
    floor: float = 0.0        # noise floor of the row's dtypes
    flags: set = field(default_factory=set)
    tensor_metrics: tuple = ()  # tensor mode: the table's (Cosine, MaxRelativeErr, One Thousandth) cells

    @property
    def diverges(self):
        return self.matched and (bool(self.flags) or self.error > self.floor)

    @property
    def target_finite(self):
        return all(v is None or not isinstance(v, float) or math.isfinite(v) for v in self.target)

    @property
    def golden_finite(self):
        return all(v is None or not isinstance(v, float) or math.isfinite(v) for v in self.golden)

    def value_key(self):
        """What identifies this tensor's value in the target run (for finding who produced it), or None
        for values too plain to tell apart (scalars, constants, empty tensors)."""
        if not self.is_tensor or any(not isinstance(v, float) for v in self.target):
            return None
        if self.target[0] == self.target[1]:
            return None
        return (self.numel,) + self.target


@dataclass
class Call:
    """One API or module call (or parameter-gradient record) with its rows, in execution order."""

    key: str
    order: int
    direction: str            # "forward", "backward" (parameters_grad counts as backward) or "debug"
    is_module: bool
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    stack_cell: object = None  # the table's NPU_Stack_Info cell, parsed only when a report needs it
    _stack: list = field(default=None, repr=False)

    @property
    def stack(self):
        """Stack lines, innermost first (empty when unknown)."""
        if self._stack is None:
            self._stack = _stack_lines(self.stack_cell)
        return self._stack

    @stack.setter
    def stack(self, lines):
        self._stack = list(lines)

    @property
    def rows(self):
        return self.inputs + self.outputs

    @property
    def matched(self):
        return any(r.matched for r in self.rows)

    @property
    def is_param_grad(self):
        return ".parameters_grad." in self.key


def split_row_name(name):
    """(call key, role, slot, is_parameter) of a flattened row name, or None when it is not one.

    >>> split_row_name("Functional.linear.3.forward.input.1")
    ('Functional.linear.3.forward', 'input', '1', False)
    >>> split_row_name("Module.fc.Linear.forward.0.parameters.weight")
    ('Module.fc.Linear.forward.0', 'input', 'weight', True)
    >>> split_row_name("Module.fc.Linear.parameters_grad.0.bias")
    ('Module.fc.Linear.parameters_grad.0', 'output', 'bias', False)
    """
    m = _PARAM_GRAD_RE.match(name)
    if m:
        return m["key"], "output", m["slot"], False
    m = _MODULE_RE.match(name) or _API_RE.match(name)
    if m:
        role = m["role"]
        return m["key"], ("input" if role == "parameters" else role), m["slot"] or "", role == "parameters"
    m = _DEBUG_RE.match(name)
    if m:
        return m["key"], "output", m["slot"] or "", False
    return None


def direction_of(key):
    if key.endswith(".debug"):
        return "debug"
    if ".backward" in key or ".parameters_grad." in key:
        return "backward"
    return "forward"


_DIMS_RE = re.compile(r"^\[\s*(\d+(?:\s*,\s*\d+)*)?\s*,?\s*\]$")


def _numel(shape):
    if isinstance(shape, str):
        m = _DIMS_RE.match(shape.strip())  # "[4, 64]": the common case, without an eval
        if m is None:
            return None
        shape = [int(x) for x in m.group(1).split(",")] if m.group(1) else []
    if isinstance(shape, (list, tuple)):
        n = 1
        for s in shape:
            if not isinstance(s, int):
                return None
            n *= s
        return n
    return None


def _is_tensor_dtype(dtype):
    text = "" if dtype is None else str(dtype)
    return bool(text) and text not in MISSING and not text.startswith("<class") and text != "nan"


def _column(table, name, n):
    return table[name].tolist() if name in table.columns else [None] * n


def _has_stack(cell):
    return isinstance(cell, (list, tuple)) and len(cell) > 0 or isinstance(cell, str) and cell.startswith("[")


def _stack_lines(cell):
    if isinstance(cell, (list, tuple)):
        return [str(x) for x in cell]
    if isinstance(cell, str) and cell.startswith("["):
        try:
            value = ast.literal_eval(cell)
        except (ValueError, SyntaxError):
            return []
        return [str(x) for x in value] if isinstance(value, (list, tuple)) else []
    return []


def calls_from_table(table):
    """The calls of one compare table, in table order, with every row's error, floor and flags.

    Args:
        table: a pandas DataFrame with msProbe's compare columns (any mode).

    Returns:
        list[Call]; rows whose names are not in the dump grammar are skipped.
    """
    n = len(table)
    col = {c: _column(table, c, n) for c in (
        "NPU Name", "Bench Name", "NPU Dtype", "Bench Dtype", "NPU Tensor Shape", "Bench Tensor Shape",
        "NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min",
        "Bench mean", "Bench l2norm", "EucDist", "MaxAbsErr", "NPU MD5", "BENCH MD5", "Err_message",
        "NPU_Stack_Info") + TENSOR_METRIC_COLUMNS}
    tensor_mode = "Cosine" in table.columns
    has_md5 = "NPU MD5" in table.columns
    t, tp = _stats_matrix(col, _TARGET_STATS)
    g, gp = _stats_matrix(col, _GOLDEN_STATS)
    errors, nonfinite = row_errors(t, tp, g, gp, floats(col["EucDist"])[0], floats(col["MaxAbsErr"])[0])
    stats = (t.tolist(), tp.tolist(), g.tolist(), gp.tolist(), errors.tolist(), nonfinite.tolist())
    calls, by_key = [], {}
    for i in range(n):
        name = col["NPU Name"][i]
        parts = split_row_name(str(name)) if name is not None else None
        if parts is None:
            continue
        key, role, slot, is_param = parts
        call = by_key.get(key)
        if call is None:
            call = Call(key=key, order=len(calls), direction=direction_of(key),
                        is_module=key.split(".", 1)[0] in ("Module", "Cell"))
            by_key[key] = call
            calls.append(call)
        if call.stack_cell is None and _has_stack(col["NPU_Stack_Info"][i]):
            call.stack_cell = col["NPU_Stack_Info"][i]
        row = _row(col, stats, i, str(name), role, slot, is_param, has_md5)
        if tensor_mode and row.matched and row.is_tensor:
            row.tensor_metrics = tuple(col[c][i] for c in TENSOR_METRIC_COLUMNS)
        (call.inputs if role == "input" else call.outputs).append(row)
    return calls


TENSOR_METRIC_COLUMNS = ("Cosine", "MaxRelativeErr", "One Thousandth Err Ratio")
_TARGET_STATS = ("NPU max", "NPU min", "NPU mean", "NPU l2norm")
_GOLDEN_STATS = ("Bench max", "Bench min", "Bench mean", "Bench l2norm")


def _stats_matrix(col, names):
    pairs = [floats(col[c]) for c in names]
    return np.stack([p[0] for p in pairs], axis=1), np.stack([p[1] for p in pairs], axis=1)


def _stat_tuple(values, present):
    return tuple([v if p else None for v, p in zip(values, present)])


def _row(col, stats, i, name, role, slot, is_param, has_md5):
    bench_name = col["Bench Name"][i]
    message = str(col["Err_message"][i] or "")
    matched = not (bench_name is None or (isinstance(bench_name, float) and math.isnan(bench_name))
                   or str(bench_name) in MISSING or "No bench data matched" in message)
    t_dtype, g_dtype = col["NPU Dtype"][i], col["Bench Dtype"][i]
    is_tensor = _is_tensor_dtype(t_dtype)
    t, tp, g, gp, errors, nonfinite = stats
    if is_tensor:
        target, golden = _stat_tuple(t[i], tp[i]), _stat_tuple(g[i], gp[i])
    else:  # scalar arguments: the value itself (may be text: a slice, a dtype, a string)
        target = tuple(number(col[c][i]) for c in _TARGET_STATS)
        golden = tuple(number(col[c][i]) for c in _GOLDEN_STATS)
    row = Row(name=name, role=role, slot=slot, is_tensor=is_tensor, is_parameter=is_param, matched=matched,
              target_dtype=str(t_dtype), golden_dtype=str(g_dtype),
              numel=_numel(col["NPU Tensor Shape"][i]) if is_tensor else None,
              target=target, golden=golden)
    if not matched:
        return row
    if not is_tensor:
        # A scalar argument stands in its own statistics columns; a changed one is a changed program.
        if str(t_dtype) != str(g_dtype) or (target[0] != golden[0] and not _both_nan(target[0], golden[0])):
            row.flags.add(ARGUMENT)
            row.error = math.inf
        return row
    row.floor, dtype_changed = dtype_pair(str(t_dtype), str(g_dtype))
    if dtype_changed:
        row.flags.add(DTYPE)
    if str(col["NPU Tensor Shape"][i]) != str(col["Bench Tensor Shape"][i]):
        row.flags.add(SHAPE)
    row.error = float(errors[i])
    if nonfinite[i]:
        row.flags.add(NONFINITE)
    elif "different positions" in message:
        # tensor mode: both sides hold inf/nan (same statistics) but not in the same elements
        row.flags.add(NONFINITE)
        row.error = math.inf
    if has_md5:
        t_md5, g_md5 = col["NPU MD5"][i], col["BENCH MD5"][i]
        if t_md5 is not None and g_md5 is not None and str(t_md5) != str(g_md5):
            # md5 mode asks for bitwise equality: different bytes are a divergence whatever the size.
            row.flags.add(CHECKSUM)
    return row


def _both_nan(a, b):
    return isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)

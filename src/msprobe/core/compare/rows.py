"""Flatten a dump into one row per tensor (or scalar argument), the unit every compare mode works on.

Row names follow msProbe's flattened op_name (msprobe-facts §3.3): the record key plus
`.input.{i}` (positional args and kwargs by name), `.output.{i}`, `.parameters.{name}`, nested
lists/dicts appending `.{i}`/`.{key}`; parameter gradients are `{key}.{param}`.

Built for size: one pass over the records filling column lists (no per-row objects), so a dump of a
million tensors flattens in seconds. Must not import torch or mindspore.
"""
from __future__ import annotations

import math

from msprobe.core.dump.reader import stat_value

COLUMNS = ("name", "key", "suffix", "role", "kind", "dtype", "shape", "max", "min", "mean", "norm",
           "requires_grad", "md5", "data_name")
TENSOR, SCALAR, NONE = "tensor", "scalar", "none"


def _is_tensor(v):
    return "dtype" in v and "shape" in v and "type" in v


def rows_from_records(data):
    """Column lists (dict name -> list) for the records of a dump.json `data` object, in dump order.

    Args:
        data: the `data` mapping of a dump.json/debug.json: key -> record.

    Returns:
        dict of equally long lists, keys as in `COLUMNS`.
    """
    cols = {c: [] for c in COLUMNS}
    add = {c: cols[c].append for c in COLUMNS}

    def emit(name, key, suffix, role, v):
        add["name"](name)
        add["key"](key)
        add["suffix"](suffix)
        add["role"](role)
        if v is None or not isinstance(v, dict):
            add["kind"](NONE)
            add["dtype"]("None")
            add["shape"]("None")
            for c in ("max", "min", "mean", "norm", "requires_grad", "md5", "data_name"):
                add[c](None)
            return
        if _is_tensor(v):
            add["kind"](TENSOR)
            add["dtype"](str(v["dtype"]))
            add["shape"](str(list(v["shape"])) if isinstance(v["shape"], (list, tuple)) else str(v["shape"]))
            add["max"](stat_value(v.get("Max")))
            add["min"](stat_value(v.get("Min")))
            add["mean"](stat_value(v.get("Mean")))
            add["norm"](stat_value(v.get("Norm")))
            add["requires_grad"](v.get("requires_grad"))
        else:  # {"type": "int", "value": 3}: its value stands in for all four statistics
            value = v.get("value")
            if isinstance(value, (list, dict)):
                value = str(value)
            add["kind"](SCALAR)
            add["dtype"](f"<class '{v.get('type')}'>")
            add["shape"]("[]")
            for c in ("max", "min", "mean", "norm"):
                add[c](value)
            add["requires_grad"](None)
        add["md5"](v.get("md5"))
        add["data_name"](v.get("data_name"))

    def walk(value, name, key, suffix, role):
        if isinstance(value, dict) and not _is_tensor(value) and "type" not in value:
            for k, item in value.items():
                walk(item, f"{name}.{k}", key, f"{suffix}.{k}", role)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{name}.{i}", key, f"{suffix}.{i}", role)
        else:
            emit(name, key, suffix, role, value)

    for key, record in data.items():
        if key.endswith(".debug"):
            walk(record, key, key, "", "debug")
            continue
        if not isinstance(record, dict):
            continue
        if ".parameters_grad." in key:
            _walk_params(record, key, walk)
            continue
        if "input_args" in record or "input_kwargs" in record:  # forward
            for i, v in enumerate(record.get("input_args") or ()):
                walk(v, f"{key}.input.{i}", key, f".input.{i}", "input")
            for k, v in (record.get("input_kwargs") or {}).items():
                walk(v, f"{key}.input.{k}", key, f".input.{k}", "input")
            for name, v in (record.get("parameters") or {}).items():
                walk(v, f"{key}.parameters.{name}", key, f".parameters.{name}", "input")
        else:  # backward: input = gradients of the outputs, output = gradients of the inputs
            for i, v in enumerate(_as_list(record.get("input"))):
                walk(v, f"{key}.input.{i}", key, f".input.{i}", "input")
        for i, v in enumerate(_as_list(record.get("output"))):
            walk(v, f"{key}.output.{i}", key, f".output.{i}", "output")
    return cols


def frame_from_records(data):
    """The rows of `rows_from_records` as a pandas DataFrame; value columns stay Python objects so
    None (absent) is not confused with NaN (a statistic that is NaN)."""
    import pandas as pd
    cols = rows_from_records(data)
    return pd.DataFrame({c: pd.Series(v, dtype=object) for c, v in cols.items()})


def _as_list(v):
    if v is None:
        return ()
    return v if isinstance(v, (list, tuple)) else (v,)


def _walk_params(record, key, walk):
    """parameters_grad `{pname: [tensor]}`: a one-element list adds no index."""
    for pname, v in record.items():
        if isinstance(v, list) and len(v) == 1:
            v = v[0]
        walk(v, f"{key}.{pname}", key, f".{pname}", "grad")


def to_float(v):
    """A statistic as a float for arithmetic: numbers and bools as floats, anything else NaN."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return math.nan

"""Flatten a dump into one row per tensor (or scalar argument), the unit every compare mode works on.

Row names follow msProbe's flattened op_name (msprobe-facts §3.3): the record key plus
`.input.{i}` (positional args and kwargs by name), `.output.{i}`, `.parameters.{name}`, nested
lists/dicts appending `.{i}`/`.{key}`; parameter gradients are `{key}.{param}`.

Built for size: one pass over the records filling column lists (no per-row objects), so a dump of a
million tensors flattens in seconds. Must not import torch or mindspore.
"""
from __future__ import annotations

import numpy as np

from msprobe.core.compare.frame import STAT_FIELDS, columns_frame
from msprobe.core.dump.reader import stat_value

COLUMNS = ("name", "key", "suffix", "role", "kind", "dtype", "shape", "dims", "max", "min", "mean", "norm",
           "requires_grad", "md5", "data_name", "fused")
# columns of Python objects; "fused" is bool (True where a record says `fused_away`, rare). "shape" is the
# shape as the table shows it, "dims" the same shape typed: a tuple of ints, None where it is not one
OBJECT_COLUMNS = COLUMNS[:-1]
# float copies of the statistics (NaN where absent or not a number), for vectorised arithmetic
FLOAT_COLUMNS = tuple("f" + c for c in STAT_FIELDS)
TENSOR, SCALAR, NONE = "tensor", "scalar", "none"
# a tensor record's field when the compiled run never held the tensor (pytorch/capture/compiled_aten.py)
FUSED_AWAY = "fused_away"
_NAN = float("nan")
_NUMERIC_OR_NONE = frozenset({float, int, bool, type(None)})
_SHARED_SUFFIXES = 32  # `.input.0` ... `.input.31` made once


def _num(v):
    t = type(v)
    if t is float:
        return v
    return float(v) if t is int or t is bool else _NAN


def rows_from_records(data):
    """Column lists (dict name -> list) for the records of a dump.json `data` object, in dump order.

    Args:
        data: the `data` mapping of a dump.json/debug.json: key -> record.

    Returns:
        (dict of equally long lists, keys as in `OBJECT_COLUMNS`; list of the indices of rows whose
        record says `fused_away`)
    """
    cols = {c: [] for c in OBJECT_COLUMNS}
    names = cols["name"]
    a_name, a_key, a_suffix, a_role, a_kind = (cols[c].append for c in ("name", "key", "suffix", "role", "kind"))
    a_dtype, a_shape, a_dims, a_rg, a_md5, a_file = (cols[c].append for c in
                                                     ("dtype", "shape", "dims", "requires_grad", "md5", "data_name"))
    a_max, a_min, a_mean, a_norm = (cols[c].append for c in ("max", "min", "mean", "norm"))
    fused = []
    # one shared (text, dims) per distinct shape, one str per dtype and suffix: fewer objects, and each
    # pickles once on the way from a worker
    shapes, dtype_texts, suffix_tables = {}, {}, {}

    def dtype_text(dtype):
        try:
            return dtype_texts.setdefault(dtype, str(dtype))
        except TypeError:  # not hashable
            return str(dtype)

    def shape_of(shape):
        """(text, dims) of a record's shape."""
        if type(shape) is not list:
            if isinstance(shape, tuple):
                return str(list(shape)), dims_of(shape)
            return str(shape), None
        try:
            return shapes[tuple(shape)]
        except KeyError:
            entry = shapes[tuple(shape)] = (str(shape), dims_of(shape))
            return entry
        except TypeError:  # a nested list: not hashable
            return str(shape), None

    def emit(key, suffix, role, v):
        if type(v) is dict and v.get(FUSED_AWAY) is True:
            fused.append(len(names))
        a_name(key + suffix)
        a_key(key)
        a_suffix(suffix)
        a_role(role)
        if type(v) is not dict:
            a_kind(NONE)
            a_dtype("None")
            a_shape("None")
            a_dims(None)
            for append in (a_max, a_min, a_mean, a_norm, a_rg, a_md5, a_file):
                append(None)
            return
        get = v.get
        if "dtype" in v and "shape" in v:
            a_kind(TENSOR)
            a_dtype(dtype_text(v["dtype"]))
            text, dims = shape_of(v["shape"])
            a_shape(text)
            a_dims(dims)
            mx, mn, me, no = get("Max"), get("Min"), get("Mean"), get("Norm")
            if type(mx) is str or type(mn) is str or type(me) is str or type(no) is str:
                mx, mn, me, no = stat_value(mx), stat_value(mn), stat_value(me), stat_value(no)
            a_rg(get("requires_grad"))
        else:  # {"type": "int", "value": 3}: its value stands in for all four statistics
            value = get("value")
            if isinstance(value, (list, dict)):
                value = str(value)
            mx = mn = me = no = value
            a_kind(SCALAR)
            a_dtype(f"<class '{get('type')}'>")
            a_shape("[]")
            a_dims(None)
            a_rg(None)
        a_max(mx)
        a_min(mn)
        a_mean(me)
        a_norm(no)
        a_md5(get("md5"))
        a_file(get("data_name"))

    def walk(value, key, suffix, role):
        if type(value) is dict:
            if "type" in value or "dtype" in value:
                emit(key, suffix, role, value)
                return
            for k, item in value.items():
                walk(item, key, f"{suffix}.{k}", role)
        elif type(value) is list or type(value) is tuple:
            for i, item in enumerate(value):
                walk(item, key, f"{suffix}.{i}", role)
        else:
            emit(key, suffix, role, value)

    def args(values, key, prefix, role):
        suffixes = suffix_tables.get(prefix)
        if suffixes is None:
            suffixes = suffix_tables[prefix] = [prefix + str(i) for i in range(_SHARED_SUFFIXES)]
        for i, v in enumerate(values):
            if type(v) is dict and "dtype" in v and "shape" in v:
                # the common case, a plain tensor: `emit` inlined (this loop runs once per row)
                suffix = suffixes[i] if i < _SHARED_SUFFIXES else prefix + str(i)
                get = v.get
                if get(FUSED_AWAY) is True:
                    fused.append(len(names))
                a_name(key + suffix)
                a_key(key)
                a_suffix(suffix)
                a_role(role)
                a_kind(TENSOR)
                try:
                    a_dtype(dtype_texts[v["dtype"]])
                except (KeyError, TypeError):
                    a_dtype(dtype_text(v["dtype"]))
                shape = v["shape"]
                try:
                    text, dims = shapes[tuple(shape)] if type(shape) is list else shape_of(shape)
                except (KeyError, TypeError):
                    text, dims = shape_of(shape)
                a_shape(text)
                a_dims(dims)
                mx, mn, me, no = get("Max"), get("Min"), get("Mean"), get("Norm")
                if type(mx) is str or type(mn) is str or type(me) is str or type(no) is str:
                    mx, mn, me, no = stat_value(mx), stat_value(mn), stat_value(me), stat_value(no)
                a_rg(get("requires_grad"))
                a_max(mx)
                a_min(mn)
                a_mean(me)
                a_norm(no)
                a_md5(get("md5"))
                a_file(get("data_name"))
            elif type(v) is dict and "dtype" in v:
                emit(key, f"{prefix}{i}", role, v)
            else:
                walk(v, key, f"{prefix}{i}", role)

    for key, record in data.items():
        if key.endswith(".debug"):
            walk(record, key, "", "debug")
            continue
        if type(record) is not dict:
            continue
        if ".parameters_grad." in key:
            for pname, v in record.items():
                if type(v) is list and len(v) == 1:  # {pname: [tensor]}: no index added
                    v = v[0]
                walk(v, key, "." + pname, "grad")
            continue
        if "input_args" in record or "input_kwargs" in record:  # forward
            args(record.get("input_args") or (), key, ".input.", "input")
            for k, v in (record.get("input_kwargs") or {}).items():
                walk(v, key, ".input." + k, "input")
            for k, v in (record.get("parameters") or {}).items():
                walk(v, key, ".parameters." + k, "input")
        else:  # backward: input = gradients of the outputs, output = gradients of the inputs
            args(_as_list(record.get("input")), key, ".input.", "input")
        args(_as_list(record.get("output")), key, ".output.", "output")
    # `walk` calls itself through its closure cell: a reference cycle that would keep every column list
    # alive until the cyclic GC runs and traverses them all
    del walk
    return cols, fused


def dims_of(shape):
    """A record's shape list as a tuple of dimensions, None when it is not a list of non-negative ints."""
    if all(type(d) is int and d >= 0 for d in shape):
        return tuple(shape)
    return None


def frame_from_records(data):
    """The rows of `rows_from_records` as a pandas DataFrame; value columns stay Python objects so
    None (absent) is not confused with NaN (a statistic that is NaN)."""
    cols, fused_rows = rows_from_records(data)
    n = len(cols["name"])
    arrays = {c: np.fromiter(cols.pop(c), dtype=object, count=n) for c in OBJECT_COLUMNS}
    arrays["fused"] = np.zeros(n, dtype=bool)
    arrays["fused"][fused_rows] = True
    for c in STAT_FIELDS:
        arrays["f" + c] = _floats(arrays[c])
    return columns_frame(arrays)


def _floats(values):
    """float64 copy of an object column of statistics: NaN where a value is absent or not a number."""
    if set(map(type, values)) <= _NUMERIC_OR_NONE:  # numpy reads None as NaN
        return np.array(values, dtype=np.float64)
    return np.fromiter(map(_num, values), dtype=np.float64, count=len(values))


def packed_frame(frame):
    """A row table in a form that pickles fast, for the trip from the process that read the golden
    dump: a statistic column that holds only floats as nothing (its float copy has the same values),
    the row names as nothing when they are key + suffix. Pickling a million rows' distinct objects one
    by one costs seconds; the other columns hold a few shared strings, which pickle once each."""
    packed = {}
    for c in frame.columns:
        values = frame[c].to_numpy()
        if values.dtype == object and "f" + c in frame.columns and set(map(type, values)) == {float}:
            packed[c] = ("floats of", "f" + c)
        elif c == "name" and _is_key_plus_suffix(values, frame["key"].to_numpy(), frame["suffix"].to_numpy()):
            packed[c] = ("key + suffix",)
        else:
            packed[c] = values
    return packed


def _is_key_plus_suffix(names, keys, suffixes):
    try:
        return np.array_equal(names, np.add(keys, suffixes))
    except TypeError:  # a key or suffix that is not a str
        return False


def unpacked_frame(packed):
    """The row table of `packed_frame`."""
    cols = {c: v for c, v in packed.items() if not isinstance(v, tuple)}
    for c, v in packed.items():
        if v[0] == "floats of":
            cols[c] = cols[v[1]].astype(object)
        elif v[0] == "key + suffix":
            cols[c] = np.add(cols["key"], cols["suffix"])
    return columns_frame({c: cols[c] for c in packed})


def frame_from_construct(construct):
    """Structure dumps have no records: one row per node of construct.json (its parent in `shape`'s
    place would mislead, so only names are compared)."""
    data = list(construct)
    n = len(data)
    cols = {c: [None] * n for c in OBJECT_COLUMNS}
    cols.update(name=data, key=data, suffix=[""] * n, role=["node"] * n, kind=[NONE] * n,
                dtype=["None"] * n, shape=["None"] * n, dims=[None] * n)
    arrays = {c: np.array(cols[c], dtype=object) for c in OBJECT_COLUMNS}
    arrays["fused"] = np.zeros(n, dtype=bool)
    arrays.update({c: np.full(n, np.nan) for c in FLOAT_COLUMNS})
    return columns_frame(arrays)


def _as_list(v):
    if v is None:
        return ()
    return v if isinstance(v, (list, tuple)) else (v,)

"""Flatten a dump into one row per tensor (or scalar argument), the unit every compare mode works on.

Row names follow msProbe's flattened op_name (msprobe-facts §3.3): the record key plus
`.input.{i}` (positional args and kwargs by name), `.output.{i}`, `.parameters.{name}`, nested
lists/dicts appending `.{i}`/`.{key}`; parameter gradients are `{key}.{param}`.

Built for size: one pass over the records filling column lists (no per-row objects), so a dump of a
million tensors flattens in seconds. Must not import torch or mindspore.
"""
from __future__ import annotations


from msprobe.core.dump.reader import stat_value

COLUMNS = ("name", "key", "suffix", "role", "kind", "dtype", "shape", "max", "min", "mean", "norm",
           "requires_grad", "md5", "data_name", "fused")
# float copies of the statistics (NaN where absent or not a number), for vectorised arithmetic
FLOAT_COLUMNS = ("fmax", "fmin", "fmean", "fnorm")
TENSOR, SCALAR, NONE = "tensor", "scalar", "none"
# a tensor record's field when the compiled run never held the tensor (pytorch/capture/compiled_aten.py)
FUSED_AWAY = "fused_away"
_NAN = float("nan")
_NUMBER_TYPES = (int, float)


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
        dict of equally long lists, keys as in `COLUMNS` and `FLOAT_COLUMNS`.
    """
    cols = {c: [] for c in COLUMNS + FLOAT_COLUMNS}
    a_name, a_key, a_suffix, a_role, a_kind = (cols[c].append for c in ("name", "key", "suffix", "role", "kind"))
    a_dtype, a_shape, a_rg, a_md5, a_file, a_fused = (cols[c].append for c in
                                                      ("dtype", "shape", "requires_grad", "md5", "data_name", "fused"))
    a_max, a_min, a_mean, a_norm = (cols[c].append for c in ("max", "min", "mean", "norm"))
    f_max, f_min, f_mean, f_norm = (cols[c].append for c in FLOAT_COLUMNS)

    def emit(key, suffix, role, v):
        a_name(key + suffix)
        a_key(key)
        a_suffix(suffix)
        a_role(role)
        if type(v) is not dict:
            a_kind(NONE)
            a_dtype("None")
            a_shape("None")
            for append in (a_max, a_min, a_mean, a_norm, a_rg, a_md5, a_file, a_fused):
                append(None)
            for append in (f_max, f_min, f_mean, f_norm):
                append(_NAN)
            return
        get = v.get
        if "dtype" in v and "shape" in v:
            shape = v["shape"]
            a_kind(TENSOR)
            a_dtype(str(v["dtype"]))
            a_shape(str(shape) if type(shape) is list else str(list(shape)) if isinstance(shape, tuple) else str(shape))
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
            a_rg(None)
        a_max(mx)
        a_min(mn)
        a_mean(me)
        a_norm(no)
        f_max(_num(mx))
        f_min(_num(mn))
        f_mean(_num(me))
        f_norm(_num(no))
        a_md5(get("md5"))
        a_file(get("data_name"))
        a_fused(get(FUSED_AWAY))

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
        for i, v in enumerate(values):
            if type(v) is dict and "dtype" in v and "shape" in v:
                # the common case, a plain tensor: `emit` inlined (this loop runs once per row)
                suffix = prefix + str(i)
                a_name(key + suffix)
                a_key(key)
                a_suffix(suffix)
                a_role(role)
                a_kind(TENSOR)
                a_dtype(str(v["dtype"]))
                shape = v["shape"]
                a_shape(str(shape) if type(shape) is list else
                        str(list(shape)) if isinstance(shape, tuple) else str(shape))
                get = v.get
                mx, mn, me, no = get("Max"), get("Min"), get("Mean"), get("Norm")
                if type(mx) is str or type(mn) is str or type(me) is str or type(no) is str:
                    mx, mn, me, no = stat_value(mx), stat_value(mn), stat_value(me), stat_value(no)
                a_rg(get("requires_grad"))
                a_max(mx)
                a_min(mn)
                a_mean(me)
                a_norm(no)
                f_max(mx if type(mx) is float else _num(mx))
                f_min(mn if type(mn) is float else _num(mn))
                f_mean(me if type(me) is float else _num(me))
                f_norm(no if type(no) is float else _num(no))
                a_md5(get("md5"))
                a_file(get("data_name"))
                a_fused(get(FUSED_AWAY))
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
    # `walk` calls itself through its closure cell: a reference cycle that kept every column list (and
    # so gigabytes) alive until the cyclic GC ran, which then took most of a second to traverse them
    del walk
    return cols


def frame_from_records(data):
    """The rows of `rows_from_records` as a pandas DataFrame; value columns stay Python objects so
    None (absent) is not confused with NaN (a statistic that is NaN)."""
    import pandas as pd
    import numpy as np
    cols = rows_from_records(data)
    # explicit object Series: pandas would otherwise turn string columns into its own string dtype
    frame = {c: pd.Series(np.array(cols[c], dtype=object), dtype=object, copy=False) for c in COLUMNS}
    frame.update({c: pd.Series(np.array(cols[c], dtype=np.float64), copy=False) for c in FLOAT_COLUMNS})
    return pd.DataFrame(frame, copy=False)


# columns rows_from_records/frame_from_construct fill with str only
_STRING_COLUMNS = frozenset({"name", "key", "suffix", "role", "kind", "dtype", "shape"})
_SEP = "\x00"  # joins a column of strings for the trip between processes (a cell holding it is sent as is)


def packed_frame(frame):
    """A row table in a form that pickles fast, for the trip from the process that read the golden
    dump: a string column as one joined string, a statistic column that holds only floats as nothing
    (its float copy has the same values). Pickling a million rows' objects one by one took seconds."""
    packed = {}
    for c in frame.columns:
        values = frame[c].to_numpy()
        if values.dtype != object:
            packed[c] = values
            continue
        types = {str} if c in _STRING_COLUMNS else set(map(type, values))
        if types == {float} and "f" + c in frame.columns:
            packed[c] = ("floats of", "f" + c)
            continue
        if types == {str}:
            try:
                text = _SEP.join(values.tolist())
            except TypeError:  # not all str after all: sent as is
                text = None
            if text is not None and text.count(_SEP) == len(values) - 1:
                packed[c] = ("joined", text, len(values))
                continue
        packed[c] = values
    return packed


def unpacked_frame(packed):
    """The row table of `packed_frame`."""
    import numpy as np
    import pandas as pd
    cols = {}
    for c, v in packed.items():
        if isinstance(v, tuple) and v[0] == "joined":
            text, n = v[1], v[2]
            cols[c] = np.fromiter(text.split(_SEP) if n else (), dtype=object, count=n)
        elif not isinstance(v, tuple):
            cols[c] = v
    for c, v in packed.items():
        if isinstance(v, tuple) and v[0] == "floats of":
            cols[c] = cols[v[1]].astype(object)
    return pd.DataFrame({c: pd.Series(cols[c], dtype=cols[c].dtype, copy=False) for c in packed}, copy=False)


def frame_from_construct(construct):
    """Structure dumps have no records: one row per node of construct.json (its parent in `shape`'s
    place would mislead, so only names are compared)."""
    import numpy as np
    import pandas as pd
    data = list(construct)
    n = len(data)
    cols = {c: [None] * n for c in COLUMNS}
    cols.update(name=data, key=data, suffix=[""] * n, role=["node"] * n, kind=[NONE] * n,
                dtype=["None"] * n, shape=["None"] * n)
    out = {c: pd.Series(np.array(cols[c], dtype=object), dtype=object, copy=False) for c in COLUMNS}
    out.update({c: pd.Series(np.full(n, np.nan), copy=False) for c in FLOAT_COLUMNS})
    return pd.DataFrame(out, copy=False)


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

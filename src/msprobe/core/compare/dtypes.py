"""Dtype names of PyTorch (`torch.float32`), MindSpore (`Float32`) and numpy (`float32`) dumps mapped
to one canonical spelling, so dumps of different frameworks compare (msprobe-facts §8.3). Data and
small functions; no framework imports.
"""

_CANONICAL = {
    "float64": "float64", "double": "float64", "float32": "float32", "float": "float32",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16",
    "int64": "int64", "long": "int64", "int32": "int32", "int": "int32", "int16": "int16", "short": "int16",
    "int8": "int8", "uint8": "uint8", "bool": "bool", "bool_": "bool",
    "complex64": "complex64", "complex128": "complex128",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
}
# Floating types one training run may legitimately use in place of another (mixed precision). msProbe
# pairs fp16/bf16/fp32 only; a value cast to fp8 or kept in fp64 still is the same value, so we pair those
# too (its Result still says the dtypes differ).
_FLOAT_FAMILY = frozenset({"float8_e4m3fn", "float8_e5m2", "float16", "bfloat16", "float32", "float64"})
_INT_FAMILY = frozenset({"int8", "int16", "int32", "int64", "uint8"})


def canonical_dtype(name):
    """`torch.bfloat16`, `BFloat16`, `bfloat16` -> `bfloat16`; unknown names come back lower-cased."""
    if name is None:
        return "None"
    text = str(name)
    if text.startswith("torch."):
        text = text[6:]
    elif text.startswith("mindspore."):
        text = text[10:]
    low = text.lower()
    return _CANONICAL.get(low, low)


def dtypes_compatible(a, b):
    """Whether rows of these dtypes may be paired at all: equal, both floats, or both ints (MindSpore and
    PyTorch disagree on default integer widths)."""
    a, b = canonical_dtype(a), canonical_dtype(b)
    return a == b or (a in _FLOAT_FAMILY and b in _FLOAT_FAMILY) or (a in _INT_FAMILY and b in _INT_FAMILY)


def per_dtype_pair(a, b, predicate):
    """bool array: `predicate(a[i], b[i])` for two equally long dtype-name arrays, evaluated once per
    distinct pair (a million rows hold a handful of dtype pairs)."""
    import numpy as np
    import pandas as pd
    if len(a) == 0:
        return np.zeros(0, dtype=bool)
    ca, ua = pd.factorize(np.asarray(a, dtype=object), use_na_sentinel=False)
    cb, ub = pd.factorize(np.asarray(b, dtype=object), use_na_sentinel=False)
    pairs, distinct = pd.factorize(ca.astype(np.int64) * len(ub) + cb)
    verdicts = np.array([bool(predicate(ua[p // len(ub)], ub[p % len(ub)])) for p in distinct], dtype=bool)
    return verdicts[pairs]

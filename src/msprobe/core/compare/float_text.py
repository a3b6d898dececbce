"""Python's `repr` of many floats at once, for the result csv's million-row columns.

orjson prints the same shortest round-trip digits as `repr` (both pick the closest of the shortest
decimal strings) about five times faster, but writes exponents its own way (`1e-7`, positional
`0.00001`); the values where `repr` uses an exponent (|x| < 1e-4 or >= 1e16) or orjson does go
through `repr` itself. Guarded by tests/core/compare/test_compare_speedups.py against `repr`.
"""
from __future__ import annotations

import numpy as np
import orjson


def float_reprs(values, suffix=""):
    """list of `repr(float(v)) + suffix` for a float64 array of finite values (NaN/inf are not handled)."""
    values = np.ascontiguousarray(values, dtype=np.float64)
    if values.size == 0:
        return []
    text = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY).decode("ascii")
    body = text[1:-1]
    out = (body.replace(",", suffix + ",") + suffix if suffix else body).split(",")
    mag = np.abs(values)
    redo = np.flatnonzero(((mag < 1e-4) & (mag != 0)) | (mag >= 1e16)).tolist()
    exponents_elsewhere = text.count("e") != sum("e" in out[i] for i in redo)
    for i in redo:
        out[i] = repr(float(values[i])) + suffix
    if exponents_elsewhere:  # orjson chose an exponent where repr does not: look at each
        for i, s in enumerate(out):
            if "e" in s:
                out[i] = repr(float(values[i])) + suffix
    return out

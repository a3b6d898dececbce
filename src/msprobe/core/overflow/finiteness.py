"""Is a recorded value finite? From its statistics (Max/Min), or from the saved tensor when they are absent.

Accepts our "inf"/"nan" strings and msProbe's bare `Infinity`/`NaN` tokens (json loads those as floats).
"""

import math
import os

import numpy as np

from msprobe.core.dump.reader import stat_value
from msprobe.core.errors import DumpFormatError

_STAT_FIELDS = ("Max", "Min")


def _number_finite(v):
    v = stat_value(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return math.isfinite(v)


def record_finite(rec, reader):
    """True/False for one value record (tensor or scalar); None when nothing tells.

    Statistics decide when present (Max and Min of a tensor are inf/nan exactly when some element is);
    otherwise the saved tensor file, if the dump has one, is read and checked.
    """
    if not isinstance(rec, dict):
        return None
    if "value" in rec and "shape" not in rec:  # a scalar argument: float('inf') passed to an op counts
        return _number_finite(rec["value"])
    verdicts = [_number_finite(rec.get(f)) for f in _STAT_FIELDS]
    if any(v is False for v in verdicts):
        return False
    if all(v is True for v in verdicts):
        return True
    name = rec.get("data_name")
    if name and reader is not None:
        path = reader.tensor_path(name)
        if os.path.isfile(path):
            try:
                array = reader.load_tensor(rec).array
            except DumpFormatError:
                return None
            if array.dtype.kind in "fc":
                return bool(np.isfinite(array).all())
            return True
    return None


def values_finite(value, reader):
    """False if any record in a nested args/output structure is non-finite, else True."""
    return all(v is not False for v in _verdicts(value, reader))


def _verdicts(value, reader):
    if isinstance(value, dict):
        if ("type" in value and "dtype" in value and "shape" in value) or ("type" in value and "value" in value):
            yield record_finite(value, reader)
            return
        for v in value.values():
            yield from _verdicts(v, reader)
    elif isinstance(value, list):
        for v in value:
            yield from _verdicts(v, reader)

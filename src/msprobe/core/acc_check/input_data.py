"""Arrays for TensorSpecs: the dumped tensor (real-data mode) or random data that keeps the recorded
shape, dtype and range (statistics mode).

Random floats are uniform in [Min, Max]; the first element is set to Min and the last to Max so the
extremes the API saw are seen again, and inf/-inf/nan are put back when the recorded Max/Min were
non-finite. Integers are uniform over [Min, Max]; bools follow Max (= any) and Min (= all). Every API
draws from its own generator seeded by its name, so a run split across workers or resumed after a kill
gives the same data. Must not import torch or mindspore.
"""

import math
import zlib

import numpy as np

from msprobe.core.acc_check import dtypes
from msprobe.core.acc_check.input_spec import TensorSpec, is_finite_number
from msprobe.core.errors import DumpFormatError

DEFAULT_RANGE = (-1.0, 1.0)  # for a float tensor whose record has no usable Max/Min


def rng_for(name, seed=1234):
    """The generator of one API: the same name and seed give the same data in every process."""
    return np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])


class TensorSource:
    """Gives the array of a TensorSpec: loaded when the dump saved it, generated otherwise.

    Args:
        reader: the DumpReader (its `load_tensor` reads `data_name` files); None = always random.
        real_data: use saved tensors when a record names one. Defaults to True.
    """

    def __init__(self, reader=None, real_data=True):
        self.reader = reader
        self.real_data = real_data and reader is not None

    def uses_real(self, spec):
        return self.real_data and bool(spec.data_name)

    def array(self, spec: TensorSpec, rng):
        if self.uses_real(spec):
            loaded = self.reader.load_tensor({"data_name": spec.data_name})
            # a private, writable copy: the file is memory-mapped read-only, and in-place APIs write
            array = np.array(loaded.array, copy=True)
            if tuple(array.shape) != spec.shape:
                raise DumpFormatError(f"{spec.data_name}: shape {tuple(array.shape)} differs from the "
                                      f"record's {list(spec.shape)}")
            return array
        return random_array(spec, rng)


def random_array(spec: TensorSpec, rng):
    kind = dtypes.kind(spec.dtype)
    if kind == "bool":
        return _random_bool(spec, rng)
    if kind == "int":
        return _random_int(spec, rng)
    if kind == "complex":
        mag = _random_float(spec, rng, dtypes.numpy_dtype("float64"))
        phase = rng.uniform(0, 2 * math.pi, spec.shape)
        return (mag * np.exp(1j * phase)).astype(dtypes.numpy_dtype(spec.dtype))
    return _random_float(spec, rng, dtypes.numpy_dtype(spec.dtype))


def _random_bool(spec, rng):
    any_true, all_true = bool(spec.max), bool(spec.min)
    if all_true or not any_true:
        return np.full(spec.shape, all_true, dtype=bool)
    out = rng.random(spec.shape) < 0.5
    flat = out.reshape(-1)
    if flat.size:
        flat[0], flat[-1] = False, True  # Max=True and Min=False: both values occur
    return out


def _random_int(spec, rng):
    lo_lim, hi_lim = dtypes.finite_range(spec.dtype)
    lo = int(spec.min) if is_finite_number(spec.min) else max(lo_lim, -100)
    hi = int(spec.max) if is_finite_number(spec.max) else min(hi_lim, 100)
    lo, hi = max(lo, lo_lim), min(hi, hi_lim)
    if hi < lo:
        lo, hi = hi, lo
    out = rng.integers(lo, hi, size=spec.shape, dtype=np.int64, endpoint=True)
    flat = out.reshape(-1)
    if flat.size:
        flat[0] = lo
        flat[-1] = hi
    return out.astype(dtypes.numpy_dtype(spec.dtype), copy=False)


def _random_float(spec, rng, np_dtype):
    mx, mn = _as_float(spec.max), _as_float(spec.min)  # None: not recorded
    specials = []
    if (mx is not None and math.isnan(mx)) or (mn is not None and math.isnan(mn)):
        specials.append(math.nan)
    if mx == math.inf:
        specials.append(math.inf)
    if mn == -math.inf:
        specials.append(-math.inf)
    if mn is not None and mn == mx:  # constant tensor, all-inf ones included
        return np.full(spec.shape, mx, dtype=np_dtype)
    lo = mn if mn is not None and math.isfinite(mn) else None
    hi = mx if mx is not None and math.isfinite(mx) else None
    if lo is None and hi is None:
        lo, hi = DEFAULT_RANGE
    elif lo is None:  # the finite part of the range is unknown below Max
        lo = hi - max(1.0, abs(hi))
    elif hi is None:
        hi = lo + max(1.0, abs(lo))
    lo_lim, hi_lim = dtypes.finite_range(spec.dtype)
    lo, hi = max(lo, lo_lim), min(hi, hi_lim)
    # Draw in float32 when the target is no wider: half the cost, same distribution.
    gen_dtype = np.float64 if np.dtype(np_dtype).itemsize > 4 or np.dtype(np_dtype).kind == "c" else np.float32
    out = rng.random(spec.shape, dtype=gen_dtype)
    span = float(hi) - float(lo)
    if math.isfinite(span) and span < np.finfo(gen_dtype).max:
        out *= gen_dtype(span)
        out += gen_dtype(lo)
    else:  # the span overflows: scale in float64 from the midpoint
        out = (out.astype(np.float64) - 0.5) * (hi / 2 - lo / 2) * 2 + (hi / 2 + lo / 2)
    flat = out.reshape(-1)
    if flat.size:
        flat[0] = lo
        flat[-1] = hi
        for i, value in enumerate(specials):
            flat[min(flat.size - 1, (i + 1) * flat.size // (len(specials) + 1))] = value
    return out.astype(np_dtype, copy=False)


def _as_float(v):
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return None if v is None or not isinstance(v, bool) else float(v)
    return float(v)

"""Dtype names as dumps write them (`torch.bfloat16`, MindSpore `BFloat16`) mapped to one canonical
name, and what the verdicts need to know about each: kind, numpy dtype of generated data, precision.
Must not import torch or mindspore.
"""

import numpy as np

# canonical name -> (kind, numpy dtype used for generated data, mantissa bits, min normal exponent)
# kind: "float", "int", "bool", "complex". bfloat16 and float8 are generated as float32 and cast by
# the framework (numpy has no such dtypes).
DTYPES = {
    "float64": ("float", "float64", 52, -1022),
    "float32": ("float", "float32", 23, -126),
    "float16": ("float", "float16", 10, -14),
    "bfloat16": ("float", "float32", 7, -126),
    "float8_e4m3fn": ("float", "float32", 3, -6),
    "float8_e5m2": ("float", "float32", 2, -14),
    "complex64": ("complex", "complex64", 23, -126),
    "complex128": ("complex", "complex128", 52, -1022),
    "int8": ("int", "int8", 0, 0),
    "int16": ("int", "int16", 0, 0),
    "int32": ("int", "int32", 0, 0),
    "int64": ("int", "int64", 0, 0),
    "uint8": ("int", "uint8", 0, 0),
    "uint16": ("int", "uint16", 0, 0),
    "uint32": ("int", "uint32", 0, 0),
    "uint64": ("int", "uint64", 0, 0),
    "bool": ("bool", "bool", 0, 0),
}

_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32",
            "bool_": "bool", "float8e4m3fn": "float8_e4m3fn", "float8e5m2": "float8_e5m2"}


def canonical_dtype(name):
    """'torch.bfloat16', 'BFloat16', 'float32' -> 'bfloat16' / 'float32'; None when unknown."""
    if not isinstance(name, str):
        return None
    n = name.rsplit(".", 1)[-1].lower()
    n = _ALIASES.get(n, n)
    return n if n in DTYPES else None


def kind(dtype):
    return DTYPES[dtype][0]


def numpy_dtype(dtype):
    return np.dtype(DTYPES[dtype][1])


def mantissa_bits(dtype):
    return DTYPES[dtype][2]


def epsilon(dtype):
    """Distance from 1.0 to the next representable value: one ULP at 1.0."""
    return 2.0 ** -DTYPES[dtype][2]


def min_normal_exponent(dtype):
    return DTYPES[dtype][3]


def finite_range(dtype):
    """(lowest, highest) finite value of a float dtype, or of an int dtype."""
    if dtype == "bfloat16":
        return -3.3895313892515355e38, 3.3895313892515355e38
    if dtype == "float8_e4m3fn":
        return -448.0, 448.0
    if dtype == "float8_e5m2":
        return -57344.0, 57344.0
    np_dtype = numpy_dtype(dtype)
    info = np.finfo(np_dtype) if kind(dtype) in ("float", "complex") else np.iinfo(np_dtype)
    return float(info.min) if kind(dtype) != "int" else int(info.min), \
        float(info.max) if kind(dtype) != "int" else int(info.max)

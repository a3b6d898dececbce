"""A Primitive's constructor arguments to JSON and back: what `api_sources.json` records for each
Primitive a Cell holds (`describe_primitive`, at dump time) and what acc_check rebuilds it from
(`primitive_from_entry`).

MindSpore keeps the arguments a primitive was built with in `init_attrs` (filled by
`prim_attr_register`). Tuples, dtypes and non-finite floats are tagged so that they come back as they
were: `{"tuple": [...]}`, `{"dtype": "Float32"}`, `{"float": "inf"}`; anything else is recorded as
`{"unsupported": repr}` and makes acc_check skip that call with the reason.
"""

import importlib
import math

import mindspore as ms
from mindspore.ops import Primitive

from msprobe.core.acc_check.api_policy import SIDE_EFFECT_NAME, RefusedApi


def _encoded(value):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": str(value)}
    if isinstance(value, (tuple, list)):
        items = [_encoded(v) for v in value]
        return {"tuple": items} if isinstance(value, tuple) else items
    if isinstance(value, ms.dtype.Type):
        return {"dtype": str(value)}
    return {"unsupported": repr(value)[:200]}


def describe_primitive(prim):
    """{"class": "module.Class", "init": {argument: encoded value}} of a Primitive instance."""
    cls = type(prim)
    attrs = getattr(prim, "init_attrs", None) or {}
    return {"class": f"{cls.__module__}.{cls.__qualname__}",
            "init": {k: _encoded(v) for k, v in attrs.items() if k != "name"}}


class UnrebuildableArgument(ValueError):
    """A recorded constructor argument that cannot be turned back into its value."""


def _decoded(value, name):
    if isinstance(value, list):
        return [_decoded(v, name) for v in value]
    if not isinstance(value, dict):
        return value
    if "tuple" in value:
        return tuple(_decoded(v, name) for v in value["tuple"])
    if "dtype" in value:
        lower = str(value["dtype"]).lower()
        dtype = getattr(ms, lower, None) or getattr(ms, lower + "_", None)   # Bool is mindspore.bool_
        if not isinstance(dtype, ms.dtype.Type):
            raise UnrebuildableArgument(f"constructor argument {name}: unknown dtype {value['dtype']!r}")
        return dtype
    if "float" in value:
        return float(value["float"])
    raise UnrebuildableArgument(f"constructor argument {name} ({value.get('unsupported', value)}) was not "
                                "recordable")


def check_primitive_class(name, cls):
    """Raises RefusedApi unless `cls` is a compute Primitive of mindspore.ops (not a Custom op, which
    loads code, nor one that writes files, prints, or calls Python back)."""
    if not (isinstance(cls, type) and issubclass(cls, Primitive) and cls.__module__.startswith("mindspore.ops")
            and not SIDE_EFFECT_NAME.search(cls.__name__)):
        raise RefusedApi(f"refused: {name} is not a compute Primitive of mindspore.ops; acc_check runs only "
                         "the framework's operators and custom APIs (see docs/safety.md)")


def primitive_from_entry(entry):
    """The Primitive an `api_sources.json` instance entry describes, built with its recorded arguments.

    Raises:
        UnrebuildableArgument: an argument was not recordable, or the class is not in this MindSpore.
    """
    name = entry.get("class") if isinstance(entry, dict) else None
    if not isinstance(name, str) or not name.startswith("mindspore.ops."):
        raise RefusedApi(f"refused: api_sources.json names class {name!r}; a Primitive is rebuilt only from "
                         "mindspore.ops (see docs/safety.md)")
    module_name, _, class_name = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):
        raise UnrebuildableArgument(f"MindSpore {ms.__version__} has no {entry['class']}") from None
    check_primitive_class(name, cls)
    if not isinstance(entry.get("init", {}), dict):
        raise UnrebuildableArgument(f"{name}: its recorded 'init' is not an object")
    init = {k: _decoded(v, k) for k, v in entry.get("init", {}).items()}
    try:
        return cls(**init)
    except (TypeError, ValueError) as e:
        raise UnrebuildableArgument(f"{class_name}({', '.join(init)}) refused its recorded arguments: "
                                    f"{str(e).splitlines()[0][:200]}") from None

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


def primitive_from_entry(entry):
    """The Primitive an `api_sources.json` instance entry describes, built with its recorded arguments.

    Raises:
        UnrebuildableArgument: an argument was not recordable, or the class is not in this MindSpore.
    """
    module_name, _, class_name = entry["class"].rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):
        raise UnrebuildableArgument(f"MindSpore {ms.__version__} has no {entry['class']}") from None
    init = {k: _decoded(v, k) for k, v in entry.get("init", {}).items()}
    try:
        return cls(**init)
    except (TypeError, ValueError) as e:
        raise UnrebuildableArgument(f"{class_name}({', '.join(init)}) refused its recorded arguments: "
                                    f"{str(e).splitlines()[0][:200]}") from None

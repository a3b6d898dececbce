"""Which MindSpore callables L1 wraps, found at run time (no hand list to go stale):

    Mint            public functions of mindspore.mint
    MintFunctional  public functions of mindspore.mint.nn.functional
    Functional      public functions of mindspore.ops (Primitive classes and instances are not functions)
    Tensor          Tensor methods and operators (`a + b` is Tensor.__add__), minus non-computational ones
    MintDistributed / Distributed   collectives of mint.distributed / communication.comm_func

Each entry is (owner, attribute, prefix, in_place).
"""

import types

import mindspore as ms

from msprobe.mindspore.capture.ignored_apis import IGNORED_FUNCTIONS, IGNORED_TENSOR, IN_PLACE_DUNDERS

def is_in_place(name):
    return name in IN_PLACE_DUNDERS or (name.endswith("_") and not name.endswith("__") and not name.startswith("_"))


def _functions(module, prefix):
    out = []
    for name in dir(module):
        if name.startswith("_") or name in IGNORED_FUNCTIONS:
            continue
        value = getattr(module, name, None)
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
            out.append((module, name, prefix, is_in_place(name)))
    return out


def _tensor_methods():
    from mindspore._c_expression import TensorPy
    names = set()
    for cls in (TensorPy, ms.Tensor):
        for name, value in vars(cls).items():
            if name in IGNORED_TENSOR or isinstance(value, (property, staticmethod, classmethod, type)):
                continue
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                continue
            if callable(value) and type(value).__name__ in ("function", "method_descriptor"):
                names.add(name)
    return [(ms.Tensor, name, "Tensor", is_in_place(name)) for name in sorted(names)]


def _collectives():
    out = []
    try:
        from mindspore.communication import comm_func
        out += [(comm_func, n, "Distributed", True) for _, n, _, _ in _functions(comm_func, "Distributed")
                if not n.startswith("get_")]
    except ImportError:
        pass
    dist = getattr(ms.mint, "distributed", None)
    if dist is not None:
        skip = ("get_", "is_", "init_", "new_", "destroy_")
        out += [(dist, n, "MintDistributed", True) for _, n, _, _ in _functions(dist, "MintDistributed")
                if not n.startswith(skip)]
    return out


def build_api_table():
    """Every (owner, attribute, prefix, in_place) L1 wraps."""
    table = _functions(ms.mint, "Mint") + _functions(ms.mint.nn.functional, "MintFunctional")
    table += _functions(ms.ops, "Functional")
    table += _tensor_methods()
    table += _collectives()
    return table

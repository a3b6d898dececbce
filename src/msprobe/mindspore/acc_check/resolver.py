"""Dump name (`Mint.where`, `MintFunctional.relu`, `Functional.matmul`, `Tensor.transpose`) -> MindSpore
callable, through the dumper's own API table read in reverse, then the namespace the prefix names.
"""

import inspect

import mindspore as ms

from msprobe.core.acc_check.api_names import ApiResolver, Unresolvable, unknown_prefix
from msprobe.mindspore.capture.api_table import build_api_table

_NAMESPACES = {"Mint": lambda: ms.mint, "MintFunctional": lambda: ms.mint.nn.functional,
               "Functional": lambda: ms.ops, "Tensor": lambda: ms.Tensor}


class MindSporeResolver(ApiResolver):
    """MindSpore callables (and attribute-free Primitives) for dump names; see ApiResolver."""

    def __init__(self, custom_apis=()):
        super().__init__(custom_apis)
        self._table = {(prefix, attr): getattr(owner, attr, None)
                       for owner, attr, prefix, _ in build_api_table()}

    def _find_builtin(self, prefix, api):
        if prefix == "Primitive":
            return _primitive(api)
        if prefix == "Jit":
            raise Unresolvable(f"Jit.{api} is a compiled graph, not an API")
        func = self._table.get((prefix, api))
        if func is None and prefix in _NAMESPACES:
            func = getattr(_NAMESPACES[prefix](), api, None)
        if prefix not in _NAMESPACES and func is None:
            raise unknown_prefix(prefix, api)
        if not callable(func):
            raise Unresolvable(f"{prefix}.{api}: MindSpore {ms.__version__} has no such API")
        return func


def _primitive(api):
    """`Primitive.dense.Dense` -> a Dense() instance. Only primitives without constructor attributes
    are rebuilt: the dump does not record attributes, and guessing them would fake errors."""
    from mindspore.ops import operations
    cls = getattr(operations, api.rsplit(".", 1)[-1], None)
    if not isinstance(cls, type):
        raise Unresolvable(f"Primitive.{api}: no such primitive in mindspore.ops.operations")
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    if params:
        names = ", ".join(p.name for p in params)
        raise Unresolvable(f"Primitive.{api}: its constructor attributes ({names}) are not in the dump")
    return cls()

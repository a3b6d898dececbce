"""Dump name (`Mint.where`, `MintFunctional.relu`, `Functional.matmul`, `Tensor.transpose`) -> MindSpore
callable, through the dumper's own API table read in reverse, then the namespace the prefix names.
`Primitive.conv2d.Conv2D.{n}` -> the primitive instance call n ran, rebuilt from the constructor
arguments in the dump's api_sources.json. A name is run only when it resolves to an operator (see
`is_operator`).
"""

import inspect

import mindspore as ms

from msprobe.core.acc_check.api_names import ApiResolver, Unresolvable, unknown_prefix
from msprobe.core.acc_check.api_policy import SIDE_EFFECT_NAME, RefusedApi, origin_of, refuse
from msprobe.mindspore.acc_check.primitives import RebuiltPrimitive
from msprobe.mindspore.capture.api_table import build_api_table
from msprobe.mindspore.capture.primitive_attrs import UnrebuildableArgument, check_primitive_class, \
    primitive_from_entry

_NAMESPACES = {"Mint": lambda: ms.mint, "MintFunctional": lambda: ms.mint.nn.functional,
               "Functional": lambda: ms.ops, "Tensor": lambda: ms.Tensor}


class MindSporeResolver(ApiResolver):
    """MindSpore callables (and attribute-free Primitives) for dump names; see ApiResolver."""

    def __init__(self, custom_apis=(), api_sources=None):
        super().__init__(custom_apis, api_sources)
        self._table = {(prefix, attr): getattr(owner, attr, None)
                       for owner, attr, prefix, _ in build_api_table()}
        self._rebuilt = {}  # (dump name, instance index) -> RebuiltPrimitive or Unresolvable
        self._operators = {id(f) for f in self._table.values() if f is not None}

    def is_operator(self, func):
        """A callable of the dumper's own API table, or a public function of mindspore.ops / mint /
        mint.nn.functional or Tensor method; never one whose name says it touches files, prints or hooks."""
        if id(func) in self._operators:
            return True
        name = getattr(func, "__name__", "")
        if not isinstance(name, str) or name.startswith("_") or SIDE_EFFECT_NAME.search(name):
            return False
        return any(getattr(ns(), name, None) is func for ns in _NAMESPACES.values()) and \
            origin_of(func).startswith("mindspore")

    def resolve_case(self, case):
        entry = self.sources["primitives"].get(f"Primitive.{case.api}") if case.prefix == "Primitive" else None
        if entry is None:
            return self.resolve(case.prefix, case.api)
        try:
            calls = entry["calls"]
            n = int(case.name.rsplit(".", 1)[1])
            if n >= len(calls):
                raise Unresolvable(f"{case.name}: api_sources.json records {len(calls)} calls of Primitive.{case.api}")
            key = (case.api, calls[n])
            instance = entry["instances"][calls[n]]
            hash(key)
        except (KeyError, IndexError, TypeError, ValueError):
            raise Unresolvable(f"{case.name}: api_sources.json's entry for Primitive.{case.api} is not "
                               "{\"instances\": [...], \"calls\": [...]}") from None
        if key not in self._rebuilt:
            try:
                self._rebuilt[key] = RebuiltPrimitive(primitive_from_entry(instance))
            except (UnrebuildableArgument, ValueError) as e:  # ValueError: no float64 benchmark for its arguments
                self._rebuilt[key] = Unresolvable(f"Primitive.{case.api}: {e}")
            except RefusedApi as e:
                self._rebuilt[key] = Unresolvable(str(e))
        hit = self._rebuilt[key]
        if isinstance(hit, Unresolvable):
            raise hit
        return hit

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
        if not self.is_operator(func):
            raise refuse(f"{prefix}.{api}", f"{origin_of(func)}.{getattr(func, '__name__', api)}",
                         "which is not a MindSpore operator")
        return func


def _primitive(api):
    """`Primitive.relu.ReLU` -> a ReLU() instance, for a dump without api_sources.json: only primitives
    without constructor arguments are rebuilt then, as guessing arguments would fake errors."""
    from mindspore.ops import operations
    cls = getattr(operations, api.rsplit(".", 1)[-1], None)
    if not isinstance(cls, type):
        raise Unresolvable(f"Primitive.{api}: no such primitive in mindspore.ops.operations")
    check_primitive_class(f"Primitive.{api}", cls)
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    if params:
        names = ", ".join(p.name for p in params)
        raise Unresolvable(f"Primitive.{api}: its constructor arguments ({names}) are not in this dump "
                           "(no api_sources.json beside dump.json: dumped by msProbe or an older msprobe)")
    return cls()

"""Dump name (`Functional.linear`, `Tensor.__add__`, `Torch.linalg_norm`, `Aten.add.Tensor`) -> torch
callable, through the dumper's own API table read in reverse, then the namespaces the prefix names.
Custom APIs (register_custom_api) are found where the dump's api_sources.json says, or through
`Prefix=python.module` entries. A name is run only when it resolves to an operator (see `is_operator`).
"""


import torch

from msprobe.core.acc_check.api_names import ApiResolver, Unresolvable, unknown_prefix
from msprobe.core.acc_check.api_policy import SIDE_EFFECT_NAME, origin_of, refuse
from msprobe.pytorch.capture.api_table import build_api_table

_SUBMODULES = {"linalg_": "linalg", "fft_": "fft", "special_": "special"}
# torch's C operator namespaces: what `torch.*`, `torch.nn.functional.*` and friends bind to.
_C_NAMESPACES = (torch._C._VariableFunctions, torch._C._nn, torch._C._linalg, torch._C._fft, torch._C._special)
_FILE_ARGUMENTS = {"filename", "path", "file", "f"}


class TorchResolver(ApiResolver):
    """torch callables for dump names; see ApiResolver."""

    def __init__(self, custom_apis=(), api_sources=None):
        super().__init__(custom_apis, api_sources)
        self._table = {v: f for f, v in build_api_table().items()}
        self._operators = set(map(id, self._table.values()))

    def is_operator(self, func):
        """An overridable torch function or Tensor method (the dumper's own table), a function of torch's
        C operator namespaces, a TensorBase method, or an aten op with no file argument; never one whose
        name says it touches files, prints or hooks."""
        if id(func) in self._operators:
            return True
        if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            return _aten_is_operator(func)
        name = getattr(func, "__name__", "")
        if not isinstance(name, str) or SIDE_EFFECT_NAME.search(name):
            return False
        if any(getattr(ns, name, None) is func for ns in _C_NAMESPACES):
            return True
        return getattr(torch._C.TensorBase, name, None) is func and not name.startswith("_")

    def _find_builtin(self, prefix, api):
        func = self._find_name(prefix, api)
        if not self.is_operator(func):
            raise refuse(f"{prefix}.{api}", f"{origin_of(func) or 'torch'}.{getattr(func, '__name__', api)}",
                         "which is not a torch operator")
        return func

    def _find_name(self, prefix, api):
        func = self._table.get((prefix, api))
        if func is not None:
            return func
        if prefix == "Tensor":
            func = getattr(torch.Tensor, api, None)
        elif prefix == "Torch":
            func = getattr(torch, api, None)
            for head, sub in _SUBMODULES.items():
                if func is None and api.startswith(head):
                    func = getattr(getattr(torch, sub), api[len(head):], None)
        elif prefix == "Functional":
            func = getattr(torch.nn.functional, api, None)
        elif prefix == "VF":
            func = getattr(torch._VF, api, None)
        elif prefix == "Aten":
            func = _aten(api)
        elif prefix == "NPU":
            raise Unresolvable(f"NPU.{api} needs torch_npu, which is not installed here")
        else:
            raise unknown_prefix(prefix, api)
        if not callable(func):
            raise Unresolvable(f"{prefix}.{api}: torch {torch.__version__} has no such API")
        return func


def _aten_is_operator(op):
    schemas = [op._schema] if isinstance(op, torch._ops.OpOverload) else \
        [getattr(op, o)._schema for o in op.overloads()]
    return not any(SIDE_EFFECT_NAME.search(s.name) or any(a.name in _FILE_ARGUMENTS for a in s.arguments)
                   for s in schemas)


def _aten(api):
    name, _, overload = api.partition(".")
    try:
        packet = getattr(torch.ops.aten, name)
        return getattr(packet, overload) if overload else packet
    except (AttributeError, RuntimeError):
        return None

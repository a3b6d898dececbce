"""Dump name (`Functional.linear`, `Tensor.__add__`, `Torch.linalg_norm`, `Aten.add.Tensor`) -> torch
callable, through the dumper's own API table read in reverse, then the namespaces the prefix names.
Custom APIs (register_custom_api) are found where the dump's api_sources.json says, or through
`Prefix=python.module` entries.
"""


import torch

from msprobe.core.acc_check.api_names import ApiResolver, Unresolvable, unknown_prefix
from msprobe.pytorch.capture.api_table import build_api_table

_SUBMODULES = {"linalg_": "linalg", "fft_": "fft", "special_": "special"}


class TorchResolver(ApiResolver):
    """torch callables for dump names; see ApiResolver."""

    def __init__(self, custom_apis=(), api_sources=None):
        super().__init__(custom_apis, api_sources)
        self._table = {v: f for f, v in build_api_table().items()}

    def _find_builtin(self, prefix, api):
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


def _aten(api):
    name, _, overload = api.partition(".")
    try:
        packet = getattr(torch.ops.aten, name)
        return getattr(packet, overload) if overload else packet
    except (AttributeError, RuntimeError):
        return None

"""Dump name (`Functional.linear`, `Tensor.__add__`, `Torch.linalg_norm`, `Aten.add.Tensor`) -> torch
callable, through the dumper's own API table read in reverse, then the namespaces the prefix names.
Custom APIs (register_custom_api) are found through `Prefix=python.module` entries.
"""


import torch

from msprobe.core.acc_check.input_spec import COMMUNICATION_PREFIXES
from msprobe.core.acc_check.api_names import Unresolvable, parse_custom_apis
from msprobe.pytorch.capture.api_table import build_api_table

_SUBMODULES = {"linalg_": "linalg", "fft_": "fft", "special_": "special"}


class TorchResolver:
    """Resolves names once per process (cached)."""

    def __init__(self, custom_apis=()):
        self._custom = parse_custom_apis(custom_apis)
        self._table = {v: f for f, v in build_api_table().items()}
        self._cache = {}

    def resolve(self, prefix, api):
        key = (prefix, api)
        if key not in self._cache:
            try:
                self._cache[key] = self._find(prefix, api)
            except Unresolvable as e:
                self._cache[key] = e
        hit = self._cache[key]
        if isinstance(hit, Unresolvable):
            raise hit
        return hit

    def _find(self, prefix, api):
        if prefix in COMMUNICATION_PREFIXES:
            raise Unresolvable(f"{prefix}.{api} is a communication op: it needs the process group of the "
                               "run and is not checked offline")
        if prefix in self._custom:
            func = getattr(self._custom[prefix], api, None)
            if callable(func):
                return func
            raise Unresolvable(f"custom API {prefix}.{api}: module {self._custom[prefix].__name__} has no "
                               f"callable {api!r}")
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
            raise Unresolvable(f"unknown API prefix {prefix!r} ({prefix}.{api}); for a custom API pass "
                               f"--custom_api {prefix}=<python module that defines {api}>")
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

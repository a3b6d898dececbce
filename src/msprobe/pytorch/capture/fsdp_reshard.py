"""Deferred summaries read before FSDP2 frees the parameters they are of.

FSDP2 (`fully_shard`) gathers a module's parameters before its forward and, once it has run, frees the
gathered memory by resizing its storage to nothing. An API record made inside that forward (L1, mix) may
wait for a batch launch (the device path); the launch must come before the free, or there is nothing left
to read. FSDP2 frees in a forward hook of its own: a hook put in front of it launches what waits. A free
that nothing announces (FSDP1, Megatron's `out.data = ...` on a sent pipeline output) is caught at the
launch instead (device.py's `_gone`): those fields resolve to null.
"""

import sys

import torch

from msprobe.pytorch import _state


def fsdp_modules(models):
    """The FSDP2 modules among `models` and their submodules (none unless FSDP is loaded already)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    kind = getattr(fsdp, "FSDPModule", None)
    if kind is None or models is None:
        return []
    roots = [models] if isinstance(models, torch.nn.Module) else list(models)
    return [m for root in roots if isinstance(root, torch.nn.Module) for m in root.modules() if isinstance(m, kind)]


class ReshardLaunches:
    """A forward hook in front of FSDP2's on each FSDP module of a model, while records are made."""

    def __init__(self, models):
        self._modules = fsdp_modules(models)
        self._handles = []

    @property
    def attached(self):
        return bool(self._handles)

    def attach(self):
        if not self._handles:
            self._handles = [m.register_forward_hook(_before_reshard, prepend=True) for m in self._modules]

    def release(self):
        for h in self._handles:
            h.remove()
        self._handles = []


def _before_reshard(module, args, output):
    if torch.compiler.is_compiling():  # first: Dynamo traces this to nothing (records there are taken at once)
        return
    session = _state.session
    if session is not None and session.summarizer.deferred:
        session.before_mutation()

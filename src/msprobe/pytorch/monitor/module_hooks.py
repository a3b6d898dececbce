"""Activation monitoring: forward hooks on the targeted modules record their inputs and outputs
(`actv`), and gradient hooks on those tensors record the gradients flowing back (`actv_grad`).

Gradients are taken with `Tensor.register_hook` on the very tensors the forward hook saw, so no
identity Functions or views are put into the user's graph (a later in-place op keeps working; the hook
then reports the gradient of the value before it). The input gradient is the gradient of the input
tensor over all its uses. Guarded by `benchmarks/monitor_overhead.py`.
"""

import weakref

import torch

from msprobe.core.monitor.targets import named, select


class ActivationMonitor:
    """Forward hooks (and gradient hooks) on every targeted module of one model chunk.

    Args:
        monitor: the `TrainerMon` (its `collecting` flag, `stats`, `batch`, `config`).
        model: the module (chunk) to hook; its submodules are named as `named_modules()` names them.
        vpp_stage: index of the chunk when the model is a list of chunks.
    """

    def __init__(self, monitor, model, vpp_stage=0):
        self.mon = monitor
        self.vpp_stage = vpp_stage
        self.handles = []
        cfg = monitor.config
        self.forward = not cfg.backward_only
        self.backward = not cfg.forward_only
        self.calls = {}
        for name, module in model.named_modules():
            spec = cfg.target_of(name)
            if spec is None:
                continue
            self.handles.append(module.register_forward_hook(self._hook(name, spec)))

    def reset_step(self):
        self.calls.clear()

    def _record(self, tag, name, micro, t):
        mon = self.mon
        mon.batch.add(tag, name, micro, t, mon.cached_stats(t), self.vpp_stage)

    def _grad_hook(self, name, micro):
        def hook(grad):
            if self.mon.collecting and grad is not None:
                self._record("actv_grad", name, micro, grad)
        return hook

    def _hook(self, module_name, spec):
        in_index, out_index = spec.get("input"), spec.get("output")
        in_grad_index, out_grad_index = spec.get("input_grad", in_index), spec.get("output_grad", out_index)

        def hook(module, args, output):
            if not self.mon.collecting:
                return
            micro = self.calls.get(module_name, 0)
            self.calls[module_name] = micro + 1
            sides = (("input", args, in_index, in_grad_index), ("output", output, out_index, out_grad_index))
            for side, value, index, grad_index in sides:
                if self.forward:
                    for name, t in named(f"{module_name}.{side}", select(value, index, torch.Tensor)):
                        self._record("actv", name, micro, t)
                if self.backward and torch.is_grad_enabled():
                    for name, t in named(f"{module_name}.{side}", select(value, grad_index, torch.Tensor)):
                        if t.requires_grad:
                            t.register_hook(self._grad_hook(name, micro))
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


class StatsCache:
    """Ops of a tensor computed once per step and version: a block's output is the next block's input,
    and several gradient hooks on one tensor receive the same gradient. Holds weak references only."""

    def __init__(self, stats):
        self.stats = stats
        self._cache = {}

    def get(self, t):
        key = id(t)
        hit = self._cache.get(key)
        if hit is not None and hit[0]() is t and hit[1] == t._version:
            return hit[2]
        vec = self.stats.raw(t)
        try:
            self._cache[key] = (weakref.ref(t), t._version, vec)
        except TypeError:
            pass
        return vec

    def clear(self):
        self._cache.clear()

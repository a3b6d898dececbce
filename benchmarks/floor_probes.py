"""The floor of an L0 dump, which host_cost.py measures beside msprobe (its `L0_floor` config, and the
base of its `L1_floor`): the hooks an L0 dump needs, each reading its tensors once with msprobe's one-pass
statistics kernel, and nothing else (no names, records, files or backward bookkeeping).

Used as a debugger: start(model) installs the hooks, their reads go to `results`, stop() does nothing,
step() removes the hooks. What msprobe adds above it (records, files, the backward walk) was measured by
knocking out one part at a time: RESULTS.md, `l0_floor.py` and `ms_l0_floor.py` (scripts since removed).
"""

import torch

from msprobe.core.dump import moments
try:  # msprobe's split: the same threads here
    from msprobe.pytorch.summary.host import PARALLEL_MIN as _PARALLEL_MIN
except ImportError:  # host_cost.py --baseline-src: a checkout from before pytorch/summary/
    from msprobe.pytorch.statistics import _PARALLEL_MIN


class HookFloor:
    """The hooks of an L0 dump: a forward hook on every submodule, a hook on the autograd node of each
    module output, a post-accumulate-grad hook on every parameter; with `read`, each reads its tensors
    once with the statistics kernel (module outputs, the module's own parameters, the gradients of the
    outputs, parameter gradients: what an L0 record holds that no other record already read)."""

    def __init__(self, read):
        if read and not moments.ENABLED:
            raise SystemExit("msprobe's statistics kernel is not built (MSPROBE_NATIVE_STATS=0?)")
        self.read = read
        self.results = []
        self._handles = []

    def _stats(self, t):
        if not self.read:
            return
        if t.dtype is torch.float32 and t.is_contiguous() and t.numel():
            n = t.numel()
            self.results.append(moments._moments(t.data_ptr(), n, moments.KINDS["float32"],
                                                 torch.get_num_threads() if n >= _PARALLEL_MIN else 1))
        else:  # not in these models' L0 records; counted, not read
            self.results.append(None)

    def start(self, model):
        for name, mod in model.named_modules():
            if name:
                self._handles.append(mod.register_forward_hook(self._forward))
        for p in model.parameters():
            self._handles.append(p.register_post_accumulate_grad_hook(lambda p: self._stats(p.grad)))

    def _forward(self, mod, args, out):
        with torch.no_grad():
            for o in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(o, torch.Tensor):
                    self._stats(o.detach())
                    if o.grad_fn is not None:
                        o.grad_fn.register_hook(self._backward)
            for p in mod._parameters.values():
                if p is not None:
                    self._stats(p.detach())

    def _backward(self, grad_inputs, grad_outputs):
        for g in grad_outputs:  # the gradients of the module's outputs; those of its inputs are the
            if g is not None:   # next module's output gradients (or the first module's input's: none)
                self._stats(g)

    def stop(self):
        pass

    def step(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        self.results = []

    def close(self):
        self.step()

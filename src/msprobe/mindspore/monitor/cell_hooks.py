"""Activation monitoring for MindSpore (PyNative): forward hooks on the targeted Cells record their inputs
and outputs (`actv`), backward hooks the gradients w.r.t. them (`actv_grad`).

MindSpore 2.x calls a Cell backward hook with (cell, grad_input, grad_output): gradients of the Cell's
inputs and of its outputs, as PyTorch's full backward hook does. A jit-compiled Cell runs no Python hooks.
"""

from mindspore import Tensor


def _tensors(value):
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, Tensor)]
    return []


def _select(value, index):
    if index is None:
        return _tensors(value)
    if isinstance(value, (tuple, list)) and index < len(value) and isinstance(value[index], Tensor):
        return [value[index]]
    return []


def _named(base, tensors):
    if len(tensors) == 1:
        return [(base, tensors[0])]
    return [(f"{base}.{i}", t) for i, t in enumerate(tensors)]


class CellActivationMonitor:
    """Hooks on every targeted Cell of one network chunk.

    Args:
        monitor: the `TrainerMon` (its `collecting` flag, `record` method, `config`).
        network: the Cell to hook; sub-Cells are named as `cells_and_names()` names them.
        vpp_stage: index of the chunk when the model is a list of chunks.
    """

    def __init__(self, monitor, network, vpp_stage=0):
        self.mon = monitor
        self.vpp_stage = vpp_stage
        self.handles = []
        self.fwd_calls, self.bwd_calls = {}, {}
        cfg = monitor.config
        for name, cell in network.cells_and_names():
            spec = cfg.target_of(name)
            if spec is None:
                continue
            if not cfg.backward_only:
                self.handles.append(cell.register_forward_hook(self._forward_hook(name, spec)))
            if not cfg.forward_only:
                self.handles.append(cell.register_backward_hook(self._backward_hook(name, spec)))

    def reset_step(self):
        self.fwd_calls.clear()
        self.bwd_calls.clear()

    def _forward_hook(self, cell_name, spec):
        def hook(cell, inputs, outputs):
            if not self.mon.collecting:
                return
            micro = self.fwd_calls.get(cell_name, 0)
            self.fwd_calls[cell_name] = micro + 1
            for side, value in (("input", inputs), ("output", outputs)):
                for name, t in _named(f"{cell_name}.{side}", _select(value, spec.get(side))):
                    self.mon.record("actv", name, t, micro, self.vpp_stage)
        return hook

    def _backward_hook(self, cell_name, spec):
        in_index = spec.get("input_grad", spec.get("input"))
        out_index = spec.get("output_grad", spec.get("output"))

        def hook(cell, grad_input, grad_output):
            if not self.mon.collecting:
                return
            micro = self.bwd_calls.get(cell_name, 0)
            self.bwd_calls[cell_name] = micro + 1
            for side, value, index in (("input", grad_input, in_index), ("output", grad_output, out_index)):
                for name, t in _named(f"{cell_name}.{side}", _select(value, index)):
                    self.mon.record("actv_grad", name, t, micro, self.vpp_stage)
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []

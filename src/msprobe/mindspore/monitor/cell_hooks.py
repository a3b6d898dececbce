"""Activation monitoring for MindSpore (PyNative): forward hooks on the targeted Cells record their inputs
and outputs (`actv`), backward hooks the gradients w.r.t. them (`actv_grad`).

MindSpore 2.x calls a Cell backward hook with (cell, grad_input, grad_output): gradients of the Cell's
inputs and of its outputs, as PyTorch's full backward hook does. A jit-compiled Cell runs no Python hooks.
"""

from mindspore import Tensor

from msprobe.core.monitor.targets import named, select


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
                for name, t in named(f"{cell_name}.{side}", select(value, spec.get(side), Tensor)):
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
                for name, t in named(f"{cell_name}.{side}", select(value, index, Tensor)):
                    self.mon.record("actv_grad", name, t, micro, self.vpp_stage)
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []

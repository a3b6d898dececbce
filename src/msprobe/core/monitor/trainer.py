"""What every framework's `TrainerMon` does alike: print_struct (each unit's input and output kinds
written to module_struct.json after the first step, then the run stops), the results accessors and
close(). The adapters (pytorch/monitor, mindspore/monitor) do the hooking and the statistics.

Must not import torch or mindspore.
"""

import json
import logging
import os

from msprobe.core.errors import MsprobeError
from msprobe.core.exit_hook import ExitHook
from msprobe.core.monitor.recorder import output_root

logger = logging.getLogger(__name__)

_MAX_DEPTH = 8  # wrappers of an optimizer looked through (Megatron's, DeepSpeed's, Accelerate's, ...)


def unwrap_optimizer(optimizer, optimizer_type, type_name, framework):
    """The innermost `optimizer_type` reached through `.optimizer` attributes: training libraries' wrappers
    (Megatron, DeepSpeed, Accelerate, Lightning, Transformers) keep the real optimizer there, sometimes
    several levels deep. `type_name` and `framework` name them in the error.

    Raises:
        MsprobeError: nothing on that chain is an `optimizer_type`.
    """
    current = optimizer
    for _ in range(_MAX_DEPTH):
        if isinstance(current, optimizer_type):
            return current
        current = getattr(current, "optimizer", None)
        if current is None:
            break
    raise MsprobeError(f"set_monitor: optimizer {type(optimizer).__name__} is not a {type_name} and has none in "
                       f"its .optimizer attribute chain; pass the {framework} optimizer")


class TrainerMonBase:
    """Mixin of an adapter's TrainerMon, which sets `config`, `rank`, `recorder`, `collecting`,
    `_handles` (hook handles) and `_activations` (activation monitors, each with `remove()`).

    Class attributes an adapter sets:
        tensor_type: the framework's tensor class (print_struct writes "tensor" for it).
        unit_word: what the framework calls a model's parts ("module", "cell"), for messages.
    """

    tensor_type = None
    unit_word = "module"
    _struct = None  # print_struct: {unit name: what it takes and returns}, filled during the first step
    _exit_hook = None

    def _close_at_exit(self):
        """Have close() run at interpreter exit (set_monitor calls this); close() drops it again, as
        it would keep the monitor, its model and optimizer alive."""
        if self._exit_hook is None:
            self._exit_hook = ExitHook()
        self._exit_hook.hold(self.close)

    @staticmethod
    def _named_units(chunk):
        """(name, unit) for `chunk` and every unit below it ('' for the chunk itself)."""
        raise NotImplementedError

    # -- print_struct ----------------------------------------------------------------------------------
    def _hook_structure(self, chunks):
        self._struct = {}
        tensor_type = self.tensor_type

        def describe(value):
            if isinstance(value, tensor_type):
                return "tensor"
            if isinstance(value, (tuple, list)):
                return f"tuple[{len(value)}]"
            return type(value).__name__

        for vpp, chunk in enumerate(chunks):
            for name, unit in self._named_units(chunk):
                def hook(unit, args, output, name=name, vpp=vpp):
                    self._struct.setdefault(name, {"vpp_stage": vpp, "type": type(unit).__name__,
                                                   "input": describe(args[0] if len(args) == 1 else args),
                                                   "output": describe(output)})
                self._handles.append(unit.register_forward_hook(hook))

    def _write_structure(self):
        path = os.path.join(output_root(), "module_struct", f"rank{self.rank}", "module_struct.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self._struct, f, indent=1)
        self.close()
        logger.warning("print_struct: %s structure written to %s; stopping as configured", self.unit_word, path)
        raise SystemExit(0)

    # -- results ---------------------------------------------------------------------------------------
    def _metrics(self, tag):
        ops = self.config.ops
        return {r.name: dict(zip(ops, r.values)) for r in self.recorder.last_rows.get(tag, [])}

    def generate_wgrad_metrics(self):
        """(reduced, unreduced): {param name: {op: value}} of the latest recorded step."""
        return self._metrics("grad_reduced"), self._metrics("grad_unreduced")

    def generate_xy_metrics(self):
        """(actv, actv_grad): {unit io name: {op: value}} of the latest recorded step (its last micro
        step)."""
        return self._metrics("actv"), self._metrics("actv_grad")

    @property
    def anomalies(self):
        """Every anomaly record raised so far on this rank."""
        return list(self.recorder.anomalies) if self.recorder else []

    @property
    def output_dir(self):
        """This rank's output directory."""
        return self.recorder.rank_dir if self.recorder else None

    def close(self):
        """Remove every hook and close the writers (also run at interpreter exit); the monitor is then
        no longer kept alive by the exit hook."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for a in self._activations:
            a.remove()
        self._activations = []
        self.collecting = False
        if self.recorder is not None:
            self.recorder.close()
        if self._exit_hook is not None:
            self._exit_hook.drop()

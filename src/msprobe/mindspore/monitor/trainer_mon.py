"""`TrainerMon` for MindSpore (PyNative): Cell activations and their gradients, the gradients the
optimizer is called with, its moments and the parameters before and after the update.

The optimizer is a Cell, so a forward pre-hook on it sees `optimizer(grads)` (`grad_reduced`: what the
optimizer gets, after any reducer or scaling of the train step; `param_origin`) and a forward hook runs
after the update (moments, `param_updated`; then the step's rows are written and the step counter
advances). `Parameter.register_hook` gives each parameter's gradient as backward computes it
(`grad_unreduced`; summed over the `grad_acc_steps` backward passes of a step). Statistics are computed
in numpy (float64) from `Tensor.asnumpy()`.
"""

import logging

from msprobe.mindspore import numpy_compat  # noqa: F401  (before any op with a Python scalar)
import mindspore
from mindspore import nn

from msprobe.core.errors import MsprobeError
from msprobe.core.monitor.config import load_monitor_config
from msprobe.core.monitor.ops import stats_from_array
from msprobe.core.monitor.records import MetricRow
from msprobe.core.monitor.recorder import StepRecorder
from msprobe.core.monitor.trainer import TrainerMonBase, unwrap_optimizer as unwrap
from msprobe.mindspore.monitor.cell_hooks import CellActivationMonitor

logger = logging.getLogger(__name__)

# optimizer attribute holding per-parameter state -> the name msProbe's tables use for it
MOMENT_NAMES = {"moment1": "exp_avg", "moments1": "exp_avg", "moment2": "exp_avg_sq", "moments2": "exp_avg_sq",
                "moments": "momentum_buffer", "accum": "sum", "mean_square": "square_avg"}


def _rank():
    try:
        from mindspore.communication import get_rank
        return get_rank()
    except Exception:  # not initialised: MindSpore raises RuntimeError or ValueError depending on backend
        return 0


def unwrap_optimizer(optimizer):
    """The innermost `mindspore.nn.Optimizer` reached through `.optimizer` attributes (core's unwrap_optimizer)."""
    return unwrap(optimizer, nn.Optimizer, "mindspore.nn.Optimizer", "nn")


def moment_tuples(optimizer):
    """{name: ParameterTuple} of the optimizer's per-parameter state, shaped like the parameters."""
    shapes = [tuple(p.shape) for p in optimizer.parameters]
    found = {}
    for attr, value in vars(optimizer).items():
        if attr in ("parameters", "_parameters") or not isinstance(value, mindspore.ParameterTuple):
            continue
        if len(value) == len(shapes) and [tuple(v.shape) for v in value] == shapes:
            found[MOMENT_NAMES.get(attr, attr)] = value
    return found


class TrainerMon(TrainerMonBase):
    """Training-state monitor for MindSpore, with the PyTorch `TrainerMon` interface.

    Args:
        config_file_path: monitor config.json.
        process_group: accepted for compatibility.
        params_have_main_grad: accepted for compatibility (MindSpore gradients come from the optimizer call).

    Example:
        >>> mon = TrainerMon("monitor_config.json")
        >>> mon.set_monitor(net, grad_acc_steps=1, optimizer=optimizer)
        >>> grad_fn = mindspore.value_and_grad(forward, None, optimizer.parameters)
        >>> for x, y in data:
        ...     loss, grads = grad_fn(x, y); optimizer(grads)

    Raises:
        ConfigError: a config field is not allowed (the message names it).
    """

    tensor_type = mindspore.Tensor
    unit_word = "cell"

    @staticmethod
    def _named_units(chunk):
        return chunk.cells_and_names()

    def __init__(self, config_file_path, process_group=None, params_have_main_grad=True):
        self.config = load_monitor_config(config_file_path)
        self.process_group = process_group
        self.collecting = False
        self.step = 0
        self.collected = 0
        self.recorder = None
        self.rank = 0
        self._rows = []
        self._handles = []
        self._activations = []

    def set_monitor(self, model, grad_acc_steps, optimizer, dp_group=None, tp_group=None, start_iteration=0):
        """Attach to a network (or list of chunks) and its optimizer; see the PyTorch `TrainerMon`.

        Raises:
            MsprobeError: optimizer or grad_acc_steps unusable.
        """
        if isinstance(grad_acc_steps, bool) or not isinstance(grad_acc_steps, int) or grad_acc_steps < 1:
            raise MsprobeError(f"set_monitor: grad_acc_steps {grad_acc_steps!r} is not allowed; "
                               "allowed: an integer >= 1")
        chunks = list(model) if isinstance(model, (list, tuple)) else [model]
        for c in chunks:
            if not isinstance(c, nn.Cell):
                raise MsprobeError(f"set_monitor: model {type(c).__name__} is not a mindspore.nn.Cell")
        self.optimizer = unwrap_optimizer(optimizer)
        self.rank = _rank()
        self.step = start_iteration
        self.recorder = StepRecorder(self.config, self.rank)
        cfg = self.config
        if cfg.print_struct:
            self._hook_structure(chunks)
        elif cfg.monitors_activations and cfg.monitors_rank(self.rank):
            self._activations = [CellActivationMonitor(self, c, vpp) for vpp, c in enumerate(chunks)]
        self._names = [p.name for p in self.optimizer.parameters]
        self._selected = [i for i, n in enumerate(self._names) if cfg.target_of(n) is not None]
        if cfg.wg_distribution:
            self.grad_acc_steps = grad_acc_steps
            for i in self._selected:
                self._handles.append(self.optimizer.parameters[i].register_hook(self._unreduced_hook(i)))
        self._handles.append(self.optimizer.register_forward_pre_hook(self._before_step))
        self._handles.append(self.optimizer.register_forward_hook(self._after_step))
        self._close_at_exit()
        self._begin_step()
        return self

    def _begin_step(self):
        self.collecting = self.config.collects(self.step, self.collected)
        self._acc_calls, self._acc_sums = {}, {}
        for a in self._activations:
            a.reset_step()

    def record(self, tag, name, tensor, micro=None, vpp_stage=0):
        dtype = str(tensor.dtype)
        if tensor.dtype == mindspore.bfloat16:
            tensor = tensor.astype(mindspore.float32)
        self._add_row(tag, name, tensor.asnumpy(), tuple(tensor.shape), dtype, micro, vpp_stage)

    def _add_row(self, tag, name, array, shape, dtype, micro=None, vpp_stage=0):
        values = stats_from_array(array, self.config.ops, self.config.eps)
        self._rows.append(MetricRow(tag, name, self.step, micro, values, shape, dtype, vpp_stage))

    def _unreduced_hook(self, i):
        def hook(grad):
            if not self.collecting or grad is None:
                return
            calls = self._acc_calls.get(i, 0) + 1
            self._acc_calls[i] = calls
            if self.grad_acc_steps == 1:
                self.record("grad_unreduced", self._names[i], grad)
                return
            array = grad.astype(mindspore.float32).asnumpy()
            total = self._acc_sums.get(i)
            self._acc_sums[i] = array.copy() if total is None else total + array
            if calls % self.grad_acc_steps == 0:
                self._add_row("grad_unreduced", self._names[i], self._acc_sums.pop(i), tuple(grad.shape),
                              str(grad.dtype))
        return hook

    def _record_params(self, tag, tensors):
        for i in self._selected:
            if tensors[i] is not None:
                self.record(tag, self._names[i], tensors[i])

    def _before_step(self, cell, args):
        if not self.collecting:
            return
        if self.config.wg_distribution and args and isinstance(args[0], (tuple, list)):
            grads = args[0]
            if len(grads) == len(self._names):
                self._record_params("grad_reduced", grads)
            else:
                logger.warning("monitor: optimizer called with %d gradients for %d parameters; step %d gradients "
                               "not recorded", len(grads), len(self._names), self.step)
        if self.config.param_distribution:
            self._record_params("param_origin", self.optimizer.parameters)

    def _after_step(self, cell, args, output):
        if self.collecting:
            if self.config.mv_distribution:
                for key, tensors in moment_tuples(self.optimizer).items():
                    self._record_params(key, tensors)
            if self.config.param_distribution:
                self._record_params("param_updated", self.optimizer.parameters)
            if self._rows:
                self.recorder.write_step(self._rows)
                self.recorder.flush()
            self._rows = []
            self.collected += 1
        if self._struct is not None:
            self._write_structure()
        self.step += 1
        self._begin_step()

"""GradientMonitor (MindSpore): record each monitored parameter's gradient every time the optimizer runs.

The gradients are read in a forward pre-hook of the optimizer Cell, i.e. the tuple it is called with
(`optimizer(grads)`), in PyNative mode. A jit/graph-compiled training step does not run Python hooks.
"""

import logging

from msprobe.mindspore import numpy_compat  # noqa: F401  (before any op with a Python scalar)
from mindspore import nn

from msprobe.core.errors import ConfigError
from msprobe.core.grad_probe.monitor_base import GradientMonitorBase
from msprobe.mindspore.grad_probe.reduce import GradReducer

logger = logging.getLogger(__name__)


def _current_rank():
    try:
        from mindspore.communication import get_rank
        return get_rank()
    except Exception:  # not initialised: MindSpore raises RuntimeError or ValueError depending on the backend
        return 0


class GradientMonitor(GradientMonitorBase):
    """Per-step, per-parameter gradient statistics and sign bitmaps (task grad_probe), MindSpore.

    Args:
        config_path: a config.json with task "grad_probe"; or pass `config` (a GradProbeConfig).

    Raises:
        ConfigError: a config field is not allowed.

    Example:
        >>> monitor = GradientMonitor("./config.json")                        # doctest: +SKIP
        >>> monitor.monitor(optimizer)                                        # doctest: +SKIP
        >>> grad_fn = mindspore.value_and_grad(forward, None, optimizer.parameters)   # doctest: +SKIP
        >>> for x, y in data:                                                 # doctest: +SKIP
        ...     loss, grads = grad_fn(x, y); optimizer(grads)
        >>> monitor.close()                                                   # doctest: +SKIP

    Steps count the optimizer calls, from 0. Output as for PyTorch:
    `dump_path/rank{R}/grad_summary_{S}.csv` and `dump_path/rank{R}/step{S}/{param}.npy`.
    """

    reducer_class = GradReducer

    def __init__(self, config_path=None, *, config=None):
        super().__init__(config_path, config=config)
        self._selected = []  # (index into the optimizer's parameters, name)

    def monitor(self, optimizer):
        """Start monitoring the parameters of `optimizer` (a mindspore.nn.Optimizer) selected by param_list."""
        if not isinstance(optimizer, nn.Optimizer):
            raise ConfigError("optimizer", type(optimizer).__name__, "a mindspore.nn.Optimizer")
        names = [p.name for p in optimizer.parameters]
        self._selected = [(i, n) for i, n in enumerate(names) if self.config.wants_param(n)]
        if not self._selected:
            raise ConfigError("grad_probe.param_list", self.config.param_list,
                              f"names (or parts of names) of the optimizer's parameters, e.g. {', '.join(names[:8])}")
        self._install(lambda: optimizer.register_forward_pre_hook(self._on_optimizer_call))

    def _on_optimizer_call(self, cell, args):
        rank = _current_rank()
        if not self._next_step(rank) or not args:
            return
        grads = args[0]
        if len(grads) != len(cell.parameters):
            logger.warning("msprobe grad_probe: optimizer called with %d gradients for %d parameters; step %d "
                           "not recorded", len(grads), len(cell.parameters), self._step)
            return
        self._record(rank, [(n, grads[i]) for i, n in self._selected if grads[i] is not None])

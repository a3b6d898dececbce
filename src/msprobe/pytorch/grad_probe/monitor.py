"""GradientMonitor (PyTorch): record every monitored parameter's gradient at each optimizer step.

The gradients are read in a global optimizer step pre-hook, i.e. as the optimizer is about to use them:
after backward, gradient accumulation, DDP's all-reduce and clipping. Nothing runs on the backward path.
"""

import logging

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from msprobe.core.errors import ConfigError
from msprobe.core.grad_probe.monitor_base import GradientMonitorBase
from msprobe.pytorch.grad_probe.reduce import GradReducer

logger = logging.getLogger(__name__)


def _current_rank():
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


class GradientMonitor(GradientMonitorBase):
    """Per-step, per-parameter gradient statistics and sign bitmaps (task grad_probe).

    Args:
        config_path: a config.json with task "grad_probe"; or pass `config` (a GradProbeConfig).

    Raises:
        ConfigError: a config field is not allowed.

    Example:
        >>> monitor = GradientMonitor("./config.json")          # doctest: +SKIP
        >>> monitor.monitor(model)                              # doctest: +SKIP
        >>> for x, y in loader:                                 # doctest: +SKIP
        ...     loss_fn(model(x), y).backward(); optimizer.step(); optimizer.zero_grad()
        >>> monitor.close()                                     # doctest: +SKIP

    Steps count the optimizer steps that update a monitored parameter, from 0. Output:
    `dump_path/rank{R}/grad_summary_{S}.csv` and `dump_path/rank{R}/step{S}/{param}.npy`.
    """

    reducer_class = GradReducer

    def __init__(self, config_path=None, *, config=None):
        super().__init__(config_path, config=config)
        self._params = []  # (name, Parameter) monitored, in model order
        self._owned = {}  # id(optimizer) -> (param count seen, holds a monitored param)

    def monitor(self, model):
        """Start monitoring the parameters of `model` (an nn.Module) selected by `param_list`."""
        if not isinstance(model, torch.nn.Module):
            raise ConfigError("model", type(model).__name__, "a torch.nn.Module")
        self._params = [(n, p) for n, p in model.named_parameters() if p.requires_grad and
                        self.config.wants_param(n)]
        if not self._params:
            names = [n for n, _ in model.named_parameters()][:8]
            raise ConfigError("grad_probe.param_list", self.config.param_list,
                              f"names (or parts of names) of trainable parameters, e.g. {', '.join(names)}")
        self._owned = {}
        self._install(lambda: register_optimizer_step_pre_hook(self._on_optimizer_step))

    def _updates_monitored(self, optimizer):
        count = sum(len(g["params"]) for g in optimizer.param_groups)
        seen = self._owned.get(id(optimizer))
        if seen is None or seen[0] != count:
            ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
            seen = self._owned[id(optimizer)] = (count, any(id(p) in ids for _, p in self._params))
        return seen[1]

    def _on_optimizer_step(self, optimizer, args, kwargs):
        if not self._updates_monitored(optimizer):
            return
        rank = _current_rank()
        if not self._next_step(rank):
            return
        by_device = {}
        for name, p in self._params:
            g = p.grad
            if g is None or g.is_sparse:
                continue
            by_device.setdefault(g.device, []).append((name, g.detach()))
        for items in by_device.values():
            self._record(rank, items)

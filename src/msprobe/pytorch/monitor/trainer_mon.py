"""`TrainerMon` for PyTorch: module activations, weight gradients before and after reduction, optimizer
moments and parameters, reduced to the configured ops once per recorded step.

Everything is driven by hooks: forward/gradient hooks on modules (see `module_hooks`), a
post-accumulate-grad hook per parameter (`grad_unreduced`: the local gradient as backward left it, before
DDP or any other data-parallel reduction is copied in and before clipping; with a process group its ops
are taken in the hook, alone all together at the end of the backward), and the optimizer's step
pre-hook (`grad_reduced`,
`param_origin`) and post-hook (moments, `param_updated`, then the step's rows are written and the step
counter advances). Guarded by `benchmarks/monitor_overhead.py`.
"""

import torch

from msprobe.core.errors import MsprobeError
from msprobe.core.monitor.config import load_monitor_config
from msprobe.core.monitor.recorder import StepRecorder
from msprobe.core.monitor.trainer import TrainerMonBase
from msprobe.pytorch.monitor.module_hooks import ActivationMonitor, StatsCache
from msprobe.pytorch.monitor.optimizer_state import moment_tensors, unwrap_optimizer
from msprobe.pytorch.monitor.stats import StatsBatch, TensorStats


def _rank():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


class TrainerMon(TrainerMonBase):
    """Training-state monitor (msProbe's TrainerMon interface).

    Args:
        config_file_path: monitor config.json (fields: targets, xy_distribution, wg_distribution,
            mv_distribution, param_distribution, ops, alert, format, ...).
        process_group: pipeline-parallel group; accepted for compatibility (anomalies are not re-ordered
            across pipeline stages here).
        params_have_main_grad: read `param.main_grad` (Megatron) where a parameter has one.
            Defaults to True; parameters without `main_grad` use `.grad`.

    Example:
        >>> mon = TrainerMon("monitor_config.json")
        >>> mon.set_monitor(model, grad_acc_steps=1, optimizer=optimizer)
        >>> for x, y in loader:                     # nothing else changes in the loop
        ...     loss_fn(model(x), y).backward(); optimizer.step(); optimizer.zero_grad()

    Raises:
        ConfigError: a config field is not allowed (the message names it).
    """

    tensor_type = torch.Tensor
    unit_word = "module"

    @staticmethod
    def _named_units(chunk):
        return chunk.named_modules()

    def __init__(self, config_file_path, process_group=None, params_have_main_grad=True):
        self.config = load_monitor_config(config_file_path)
        self.process_group = process_group
        self.params_have_main_grad = params_have_main_grad
        self.stats = TensorStats(self.config.ops, self.config.eps)
        self.cache = StatsCache(self.stats)
        self.batch = StatsBatch(self.stats)
        self.collecting = False
        self.step = 0
        self.collected = 0
        self.recorder = None
        self.rank = 0
        self._handles = []
        self._activations = []
        self._unreduced = []   # ([param index], [grad], [grad version], raw ops matrix) per batch of hook calls
        self._pending = []     # params whose gradient is complete in the running backward (single process)
        self._acc_calls = {}
        self._updated = None   # ([param versions], raw ops matrix) of the last param_updated

    # -- setup -----------------------------------------------------------------------------------------
    def set_monitor(self, model, grad_acc_steps, optimizer, dp_group=None, tp_group=None, start_iteration=0):
        """Attach to a model (or a list of model chunks) and its optimizer.

        Args:
            model: `nn.Module`, or a list of modules (virtual pipeline chunks; the index is `vpp_stage`).
            grad_acc_steps: micro batches per optimizer step; the unreduced gradient is recorded after the
                last one.
            optimizer: a `torch.optim.Optimizer`, or a wrapper holding one in `.optimizer`.
            dp_group, tp_group: accepted for compatibility; every rank records its own gradients.
            start_iteration: step number of the first optimizer step (when resuming).

        Raises:
            MsprobeError: optimizer or grad_acc_steps unusable.
        """
        if isinstance(grad_acc_steps, bool) or not isinstance(grad_acc_steps, int) or grad_acc_steps < 1:
            raise MsprobeError(f"set_monitor: grad_acc_steps {grad_acc_steps!r} is not allowed; "
                               "allowed: an integer >= 1")
        if self.recorder is not None:
            raise MsprobeError("set_monitor: this TrainerMon is already attached; create a new one")
        chunks = list(model) if isinstance(model, (list, tuple)) else [model]
        for c in chunks:
            if not isinstance(c, torch.nn.Module):
                raise MsprobeError(f"set_monitor: model {type(c).__name__} is not a torch.nn.Module")
        self.optimizer = unwrap_optimizer(optimizer)
        self.grad_acc_steps = grad_acc_steps
        self.rank = _rank()
        self.step = start_iteration
        self.recorder = StepRecorder(self.config, self.rank)
        self._name_params(chunks)
        cfg = self.config
        if cfg.print_struct:
            self._hook_structure(chunks)
        elif cfg.monitors_activations and cfg.monitors_rank(self.rank):
            self._activations = [ActivationMonitor(self, c, vpp) for vpp, c in enumerate(chunks)]
        # With a process group, a data-parallel wrapper may write the reduced gradient into .grad during
        # the backward, so each gradient is reduced to its ops the moment it is complete; alone, nothing
        # can, and all of them are taken together at the end of the backward (one foreach kernel).
        dist = torch.distributed
        self._eager_unreduced = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if cfg.wg_distribution:
            for p in self.params:
                self._handles.append(p.register_post_accumulate_grad_hook(self._unreduced_hook))
        self._handles.append(self.optimizer.register_step_pre_hook(self._before_step))
        self._handles.append(self.optimizer.register_step_post_hook(self._after_step))
        self._close_at_exit()
        self._begin_step()
        return self

    def _name_params(self, chunks):
        names = {}
        for vpp, chunk in enumerate(chunks):
            for name, p in chunk.named_parameters():
                if self.config.target_of(name) is not None:
                    names.setdefault(p, (name, vpp))
        opt_params = [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]
        self.params, self.param_names, self.param_vpp = [], [], []
        for i, p in enumerate(opt_params):
            if p not in names:
                if self.config.targets:
                    continue
                names[p] = (f"param_{i}", 0)
            self.params.append(p)
            self.param_names.append(names[p][0])
            self.param_vpp.append(names[p][1])
        self._param_index = {p: i for i, p in enumerate(self.params)}

    # -- per step --------------------------------------------------------------------------------------
    def _begin_step(self):
        self.collecting = self.config.collects(self.step, self.collected)
        if not self.collecting:
            self._updated = None
        self._unreduced = []
        self._pending = []
        self._acc_calls.clear()
        for a in self._activations:
            a.reset_step()

    def cached_stats(self, t):
        return self.cache.get(t)

    def _grad_of(self, p):
        if self.params_have_main_grad and getattr(p, "main_grad", None) is not None:
            return p.main_grad
        return p.grad

    def _unreduced_hook(self, p):
        if not self.collecting:
            return
        calls = self._acc_calls.get(p, 0) + 1
        self._acc_calls[p] = calls
        if calls % self.grad_acc_steps:
            return
        if self._eager_unreduced:
            g = self._grad_of(p)
            if g is not None:
                self._unreduced.append(([self._param_index[p]], [g], [g._version], self.stats.raw(g).unsqueeze(0)))
            return
        self._pending.append(p)
        if len(self._pending) == 1:
            torch.autograd.Variable._execution_engine.queue_callback(self._flush_pending)

    def _flush_pending(self):
        """End of a backward pass (single process): the ops of every gradient accumulated in it, at once."""
        pairs = [(self._param_index[p], self._grad_of(p)) for p in self._pending]
        pairs = [(i, g) for i, g in pairs if g is not None]
        self._pending = []
        if pairs:
            grads = [g for _, g in pairs]
            self._unreduced.append(([i for i, _ in pairs], grads, [g._version for g in grads],
                                    self.stats.raw_many(grads)))

    def _add_group(self, tag, idxs, tensors):
        idxs = list(idxs)
        if tensors:
            self.batch.add_many(tag, [self.param_names[i] for i in idxs], tensors, self.stats.raw_many(tensors),
                                [self.param_vpp[i] for i in idxs])

    def _before_step(self, optimizer, args, kwargs):
        if not self.collecting:
            return
        cfg = self.config
        if cfg.wg_distribution:
            for idxs, grads, _, matrix in self._unreduced:
                self.batch.add_many("grad_unreduced", [self.param_names[i] for i in idxs], grads, matrix,
                                    [self.param_vpp[i] for i in idxs])
            self._add_reduced_grads()
        if cfg.param_distribution:
            if self._updated is not None and self._updated[0] == [p._version for p in self.params]:
                # untouched since the last step's param_updated: same values, no second pass over them
                self.batch.add_many("param_origin", self.param_names, self.params, self._updated[1], self.param_vpp)
            else:
                self._add_group("param_origin", range(len(self.params)), self.params)

    def _add_reduced_grads(self):
        """grad_reduced: gradients no reduction wrote into since the unreduced ops were taken (one process,
        or a data-parallel wrapper that left them alone) reuse those ops; the rest are computed now."""
        covered = set()
        for idxs, grads, versions, matrix in self._unreduced:
            if all(self._grad_of(self.params[i]) is g and g._version == v for i, g, v in zip(idxs, grads, versions)):
                self.batch.add_many("grad_reduced", [self.param_names[i] for i in idxs], grads, matrix,
                                    [self.param_vpp[i] for i in idxs])
                covered.update(idxs)
        fresh = [(i, self._grad_of(p)) for i, p in enumerate(self.params) if i not in covered]
        fresh = [(i, g) for i, g in fresh if g is not None]
        self._add_group("grad_reduced", [i for i, _ in fresh], [g for _, g in fresh])

    def _after_step(self, optimizer, args, kwargs):
        if self.collecting:
            cfg = self.config
            if cfg.mv_distribution:
                for key, (idxs, tensors) in moment_tensors(self.optimizer, self.params).items():
                    self._add_group(key, idxs, tensors)
            if cfg.param_distribution:
                matrix = self.stats.raw_many(self.params)
                self.batch.add_many("param_updated", self.param_names, self.params, matrix, self.param_vpp)
                self._updated = ([p._version for p in self.params], matrix)
            self._write_step()
            self.collected += 1
        if self._struct is not None:
            self._write_structure()
        self.step += 1
        self._begin_step()

    def _write_step(self):
        rows = self.batch.resolve(self.step)
        self.cache.clear()
        if rows:
            self.recorder.write_step(rows)
            self.recorder.flush()

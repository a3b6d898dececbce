"""PrecisionDebugger for PyTorch: the capture layers under core/dump/lifecycle.py's start/stop/step.

    start()  -> L1/mix enter the ApiCapture mode and wrap collectives; L0/mix hook the model's
                submodules; L2 adds the aten mode under the API mode.
"""

import logging
import sys
import weakref

import torch

from msprobe.core.dump.api_sources import StepApiSources
from msprobe.core.dump import optimizer_updates
from msprobe.core.dump.lifecycle import DumpLifecycle
from msprobe.core.errors import ConfigError, MsprobeError
from msprobe.pytorch import _state
from msprobe.pytorch.capture.api_mode import ApiCapture
from msprobe.pytorch.capture.aten_mode import AtenCapture
from msprobe.pytorch.capture.debug_save import save_variable
from msprobe.pytorch.capture.fsdp_reshard import ReshardLaunches
from msprobe.pytorch.capture.modules import ModuleCapture, has_compiled_modules
from msprobe.pytorch.capture.patched_api import PatchedApis
from msprobe.pytorch.session import DumpSession, current_rank
from msprobe.pytorch.summary.device import drop_free_stages
from msprobe.pytorch.tool_work import tool_work

logger = logging.getLogger(__name__)


class PrecisionDebugger(StepApiSources, DumpLifecycle):
    """Dump what a PyTorch model computes, as msProbe's dump format.

    Args:
        config_path: config.json; without it: task statistics, level L1, dump_path ./dump_path.
        task, dump_path, level, step: override the file's fields.

    Raises:
        ConfigError: a config field or argument is not allowed.

    Example:
        >>> from msprobe.pytorch import PrecisionDebugger
        >>> debugger = PrecisionDebugger(dump_path="./dump_path", level="mix")   # doctest: +SKIP
        >>> for x, y in loader:                                                  # doctest: +SKIP
        ...     debugger.start(model)
        ...     loss = loss_fn(model(x), y); loss.backward(); opt.step()
        ...     debugger.stop()
        ...     debugger.step()
    """

    state = _state
    model_types = (torch.nn.Module,)
    model_words = "an nn.Module"
    unit_words = "modules"

    def __init__(self, config_path=None, task=None, dump_path=None, level=None, step=None):
        super().__init__(config_path, task=task, dump_path=dump_path, level=level, step=step)
        self._api_capture = None
        self._aten_capture = None
        self._modules = None
        self._reshards = None  # capture/fsdp_reshard.py: launches before FSDP2 frees what records wait for
        self._patched = PatchedApis()
        self._optim_handles = []
        self._optim_frames = {}  # id(optimizer) -> its step's open update records (core/dump/optimizer_updates.py)
        self._param_names = None  # (models' stamp, id(parameter) -> (weak reference, name)): _parameter_names
        self._compile_marker = None  # capture/compiled.py's marker of the level while a compiled model is dumped
        self._record_order = None  # capture/compiled.py's RecordOrder, held from a dumped step's start() to its end
        self._compile_noted = set()  # the notes about a compiled model start() has given

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, model=None, token_range=None, rank_id=None):
        """Start (or resume, within a step) collection.

        Args:
            model: nn.Module or list/tuple of them; required for L0 and mix, and for token_range.
            token_range: [start, end] forward iterations of `model` to dump (autoregressive decoding).
            rank_id: names the rank{ID} folder instead of torch.distributed's rank.
        """
        if self.config.level == "debug":
            return
        self._start_dump(model, token_range, rank_id)

    def register_custom_api(self, module, api, api_prefix=None):
        """Record `module.api` at L1 as `{api_prefix}.{api}.{n}` (prefix defaults to the module name)."""
        if not isinstance(api, str) or not hasattr(module, api):
            raise ConfigError("api", api, f"the name of a callable attribute of {module!r}")
        prefix = api_prefix or getattr(module, "__name__", type(module).__name__).rsplit(".", 1)[-1]
        self._custom[(id(module), api)] = (module, prefix)
        self._note_custom_api(module, api, prefix)  # api_sources.json: acc_check finds it there
        if self._running:
            self._patched.patch(module, api, prefix, api)

    # -- the adapter's part of the lifecycle ----------------------------------------------------
    @classmethod
    def _gradient_monitor_class(cls):
        from msprobe.pytorch.grad_probe import GradientMonitor
        return GradientMonitor

    def _new_session(self, rank):
        self._begin_api_sources()  # api_sources.json: where the custom APIs live
        # with CUDA in use, summaries are read back without waiting and records written on the lane
        lane = self._writer_lane() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return DumpSession(self.config, self.current_step, rank, pool=self._writer_pool(), overflow=self._overflow,
                           lane=lane)

    def _current_rank(self):
        return current_rank()

    def _save_variable(self, session, variable, name, count, save_backward):
        save_variable(session, variable, name, count, save_backward)

    def _on_new_model(self):
        if self._modules is not None:
            self._modules.release()  # hooks of the previous model
            self._modules = None
        if self._reshards is not None:
            self._reshards.release()
            self._reshards = None

    def _end_step(self, next_dumped):
        if self._record_order is not None:
            self._record_order.release()
        if self._reshards is not None and self._reshards.attached and not next_dumped \
                and not has_compiled_modules(self._model):
            self._reshards.release()  # (on a compiled model they stay, idle, as the module hooks do)
        if self._modules is None:
            return
        if next_dumped or self._modules.compiled is not None and has_compiled_modules(self._model):
            # the hooks stay, idle, until the next step's start(); on a compiled model always: Dynamo guards
            # on their ids, so new hooks would recompile it, while its steps without msprobe's mode on the
            # stack run code compiled without them
            self._modules.end_step()
        else:
            # the next step is not dumped: no idle hooks on the model meanwhile (a later dumped step's
            # start() installs them again)
            self._modules.release()

    def _release_capture(self):
        if self._record_order is not None:
            self._record_order.release()
        if self._modules is not None:
            self._modules.release()
        if self._reshards is not None:
            self._reshards.release()
        drop_free_stages()  # (close(): the staging buffers kept for the next step go)

    def _capture_on(self):
        level = self.config.level
        compiled = _compiled_capture()
        compiled_model = compiled is not None and self._model is not None and has_compiled_modules(self._model)
        if compiled is not None:
            if self._record_order is None:
                self._record_order = compiled.RecordOrder()
            self._record_order.hold()  # until the step ends: its backward may compile after stop()
        if compiled_model:
            for note in compiled.compile_notes(self._model, level):
                if note not in self._compile_noted:
                    self._compile_noted.add(note)
                    logger.warning(note)
        if level in ("L0", "mix"):
            if self._modules is None:
                self._modules = ModuleCapture(self._model)
            self._modules.compiled = compiled
            self._modules.attach()
        if compiled_model and level != "L1" and self._compile_marker is None:  # below the L1 mode: entered first
            self._compile_marker = compiled.marker(level)
            self._compile_marker.__enter__()
        if level in ("L1", "mix", "L2"):
            if self._reshards is None:  # (API records made inside an FSDP2 module may wait for a batch)
                self._reshards = ReshardLaunches(self._model)
            self._reshards.attach()
            if self._api_capture is None:
                self._api_capture = ApiCapture()
            self._api_capture.compiled = compiled
            # L2 on a compiled model: an aten-level mode would stop Dynamo compiling; the compiled graphs
            # record the aten ops instead (capture/compiled_aten.py)
            self._api_capture.aten = level == "L2" and compiled_model
            if self._capturing:
                return
            self._api_capture.__enter__()
            if level == "L2":
                if not compiled_model:  # entered after ApiCapture: the API handler runs first, then aten below it
                    if self._aten_capture is None:
                        self._aten_capture = AtenCapture()
                    self._aten_capture.__enter__()
            else:
                self._patched.patch_collectives()
                for (_, api), (module, prefix) in self._custom.items():
                    self._patched.patch(module, api, prefix, api)
                # a user's Function as one API: at L1, and inside a compiled model at mix too, where Dynamo
                # records its ops one by one otherwise (eager mix: its module's record holds its backward)
                if compiled_model:
                    self._patched.patch_compiled_functions()
                elif level == "L1":
                    self._patched.patch_functions()
        if not self._optim_handles:
            # the optimizer changes parameters in place: statistics waiting for a batch launch go first;
            # at mix the APIs it runs get "optimizer" as their parent in construct.json
            from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                               register_optimizer_step_pre_hook)
            self._optim_handles = [register_optimizer_step_pre_hook(self._optim_enter),
                                   register_optimizer_step_post_hook(self._optim_exit)]
        self._capturing = True

    def _optim_enter(self, optimizer, args, kwargs):
        session = self._session
        if session is not None:
            session.before_mutation()
            session.in_optimizer = self.config.level == "mix"
            if self.config.level in ("L1", "mix") and self._capturing and not _state.depth:
                with tool_work():  # reading `.grad` of every parameter: not through the API mode's handler
                    updates = self._parameter_updates(optimizer)
                self._optim_frames[id(optimizer)] = optimizer_updates.begin(session, type(optimizer).__name__, updates)

    def _optim_exit(self, optimizer, args, kwargs):
        frames = self._optim_frames.pop(id(optimizer), None)
        if self._session is not None:
            if frames:
                optimizer_updates.end(self._session, frames)
            self._session.in_optimizer = False

    def _parameter_updates(self, optimizer):
        """(name, parameter, gradient) of each parameter the optimizer is about to update; the name is
        the model's (named_parameters of the model given to start()), else `param_groups.{g}.{i}`."""
        names = self._parameter_names()
        out = []
        rebuilt = False
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                grad = p.grad
                if grad is None:
                    continue
                named = names.get(id(p))
                if (named is None or named[0]() is not p) and not rebuilt:
                    # a parameter the table has not seen (a module replaced since): walk the models again
                    names, rebuilt = self._parameter_names(refresh=True), True
                    named = names.get(id(p))
                out.append((named[1] if named is not None and named[0]() is p else f"param_groups.{g}.{i}",
                            p, grad))
        return out

    def _parameter_names(self, refresh=False):
        """id(parameter) -> (weak reference, its name) over the models given to start(): walked once for
        a set of models (and again when a parameter is missing), not at every optimizer step."""
        models = self._model if isinstance(self._model, (list, tuple)) else [self._model]
        models = [m for m in models if isinstance(m, torch.nn.Module)]
        stamp = tuple(id(m) for m in models)
        cached = self._param_names
        if not refresh and cached is not None and cached[0] == stamp:
            return cached[1]
        names = {}
        for model in models:
            for name, p in model.named_parameters():
                if id(p) not in names:  # a torch.compile'd model's parameters are named as the eager model's
                    names[id(p)] = (weakref.ref(p), ".".join(part for part in name.split(".") if part != "_orig_mod"))
        self._param_names = (stamp, names)
        return names

    def _capture_off(self):
        if not self._capturing:
            return
        self._capturing = False
        if self._api_capture is not None and self.config.level in ("L1", "mix", "L2"):
            try:
                if self.config.level == "L2" and not self._api_capture.aten:
                    self._aten_capture.__exit__(None, None, None)
                self._api_capture.__exit__(None, None, None)
            except Exception as e:  # another mode was pushed after ours and not popped
                raise MsprobeError(f"stop(): could not leave msprobe's capture mode ({e}); "
                                   "exit modes entered after start() before calling stop()") from None
            self._patched.restore()
        if self._compile_marker is not None:
            self._compile_marker.__exit__(None, None, None)
            self._compile_marker = None
        if self._modules is not None:
            self._modules.detach()
        for h in self._optim_handles:
            h.remove()
        self._optim_handles = []


def _compiled_capture():
    """capture/compiled.py once torch.compile is in use (Dynamo is loaded), else None: the capture layers
    then record inside compiled graphs too."""
    if "torch._dynamo" not in sys.modules:
        return None
    from msprobe.pytorch.capture import compiled
    return compiled

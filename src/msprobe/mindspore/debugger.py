"""PrecisionDebugger for MindSpore: the capture layers under core/dump/lifecycle.py's start/stop/step.

    start()  -> L1/mix wrap the APIs (and the Primitives of the model passed); L0/mix hook the
                model's sub-Cells.

In GRAPH_MODE, start() hands over to static_graph.py (L0 through ops.TensorDump, L2 through
MindSpore's own dump); everything else here is PyNative.
"""

import logging
import os
import weakref

import mindspore as ms

from msprobe.core.dump.api_sources import StepApiSources
from msprobe.core.dump.lifecycle import DumpLifecycle
from msprobe.core.errors import ConfigError
from msprobe.mindspore import _state, context_params, optimizer_step
from msprobe.mindspore.capture.cells import CellCapture, all_cells, jit_cells
from msprobe.mindspore.capture.debug_save import save_variable
from msprobe.mindspore.capture.patched_api import PatchedApis
from msprobe.mindspore.session import DumpSession, current_rank
from msprobe.mindspore.sync_execution import SynchronousOps

logger = logging.getLogger(__name__)


class PrecisionDebugger(StepApiSources, DumpLifecycle):
    """Dump what a MindSpore model computes, in msProbe's dump format.

    Args:
        config_path: config.json; without it: task statistics, level L1, dump_path ./dump_path.
        task, dump_path, level, step: override the file's fields.

    Raises:
        ConfigError: a config field or argument is not allowed.

    Example:
        >>> from msprobe.mindspore import PrecisionDebugger
        >>> debugger = PrecisionDebugger(dump_path="./dump_path", level="mix")   # doctest: +SKIP
        >>> for x, y in loader:                                                  # doctest: +SKIP
        ...     debugger.start(net)
        ...     loss, grads = grad_fn(x, y); optimizer(grads)
        ...     debugger.stop()
        ...     debugger.step()
    """

    state = _state
    model_types = (ms.nn.Cell,)
    model_words = "a mindspore.nn.Cell"
    unit_words = "Cells"

    def __init__(self, config_path=None, task=None, dump_path=None, level=None, step=None):
        super().__init__(config_path, task=task, dump_path=dump_path, level=level, step=step)
        self._cells = None
        self._patched = PatchedApis()
        self._static = None
        self._jit_warned = False
        self._sync = SynchronousOps()  # capture runs MindSpore synchronously on a CPU: see sync_execution.py
        self._model_cells = None  # (all_cells, jit_cells) of the model: walked once per model, as CellCapture's
        # its trainable Parameters, walked once per model: one frozen or unfrozen since is read when its
        # record is made instead of with the others (the same values)
        self._model_params = None
        _state.debugger = weakref.ref(self)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, model=None, token_range=None, rank_id=None):
        """Start (or resume, within a step) collection.

        Args:
            model: Cell or list/tuple of Cells; required for L0 and mix and for token_range; at L1 it
                adds the Primitive ops its Cells hold.
            token_range: [start, end] forward iterations of `model` to dump (autoregressive decoding).
            rank_id: names the rank{ID} folder instead of mindspore.communication's rank.
        """
        cfg = self.config
        if context_params.graph_mode():
            self._start_static(model)
            return
        if cfg.level == "L2":
            from msprobe.mindspore.static_graph import start_kernel_dump
            if self._static is None:
                self._static = start_kernel_dump(cfg, self.current_step)
            return
        if cfg.level == "debug":
            return
        if model is None and self._model is not None:
            model = self._model  # MsprobeStep calls start() without the model given once before
        self._start_dump(model, token_range, rank_id)

    def set_init_step(self, step):
        """Count steps from `step` (call before the training loop)."""
        super().set_init_step(step)
        if self._session is not None and self._session.writer is None:
            self._session.renumber(step)  # start(model) ran before Model.train: nothing written yet

    def register_custom_api(self, module, api, api_prefix):
        """Record `module.api` at L1 as `{api_prefix}.{api}.{n}`."""
        if not isinstance(api, str) or not callable(getattr(module, api, None)):
            raise ConfigError("api", api, f"the name of a callable attribute of {module!r}")
        if not isinstance(api_prefix, str) or not api_prefix:
            raise ConfigError("api_prefix", api_prefix, "a non-empty string (the prefix of the dump keys)")
        self._custom[(id(module), api)] = (module, api_prefix)
        self._note_custom_api(module, api, api_prefix)  # api_sources.json: acc_check finds it there
        if self._capturing:
            self._patched.restore(module, api)
            self._patched.patch(module, api, api_prefix, api)

    # -- the adapter's part of the lifecycle ----------------------------------------------------
    @classmethod
    def _gradient_monitor_class(cls):
        from msprobe.mindspore.grad_probe import GradientMonitor
        return GradientMonitor

    def _current_rank(self):
        return current_rank()

    def _save_variable(self, session, variable, name, count, save_backward):
        save_variable(session, variable, name, count, save_backward)

    def _end_step(self, next_dumped):
        if self._cells is not None:
            if next_dumped:
                self._cells.end_step()  # the hooks stay, idle, for the next step
            else:
                self._cells.release()
        if not next_dumped:
            self._patched.restore()  # the next step is not dumped: no idle wrappers through it
        if self._static is not None:
            self._static.step()

    def _release_capture(self):
        if self._cells is not None:
            self._cells.release()
        self._patched.restore()

    def _on_new_model(self):
        self._model_cells = self._model_params = None
        if self._cells is not None:
            self._cells.release()  # hooks of the previous model
            self._cells = None
        self._share_params()

    def _share_params(self):
        """Tell the step's session(s) which Parameters to read together (DumpSession.param_record)."""
        if self._session is None:
            return
        params = self._model_params
        if params is None:
            params = self._model_params = _trainable_params(self._model)
        for session in (self._session, self._session.graph):
            if session is not None:
                session.params_changed()
                session.model_params = params

    def _new_session(self, rank):
        cfg = self.config
        jit = self._cells_of_model()[1] if cfg.level in ("L0", "mix") and self._model is not None else []
        if jit:
            # seed 000: a jit-compiled Cell at L0/mix splits the dump into graph/ and pynative/
            session = DumpSession(cfg, self.current_step, rank, pool=self._writer_pool(),
                                  dump_path=os.path.join(cfg.dump_path, "pynative"), overflow=self._overflow)
            session.graph = DumpSession(cfg, self.current_step, rank, pool=self._writer_pool(),
                                        dump_path=os.path.join(cfg.dump_path, "graph"), overflow=self._overflow)
            self._warn_jit(jit)
        else:
            session = DumpSession(cfg, self.current_step, rank, pool=self._writer_pool(), overflow=self._overflow)
        self._session = session
        self._share_params()
        self._begin_api_sources()  # api_sources.json: Primitive arguments, custom API modules
        return session

    def _cells_of_model(self):
        if self._model_cells is None:
            self._model_cells = (all_cells(self._model), jit_cells(self._model))
        return self._model_cells

    def _capture_on(self):
        if self._capturing:
            return
        self._sync.enter()
        self._session.synchronous = self._sync.synchronous()
        self._session.read_params_early()
        self._patched.patch_grad()
        level = self.config.level
        if level in ("L0", "mix"):
            if self._cells is None:
                self._cells = CellCapture(self._model)
            self._cells.attach()
        if level in ("L1", "mix"):
            self._patched.claim()
            self._patched.patch_builtin()
            self._patched.patch_jit()
            if self._model is not None:
                self._patched.patch_primitives(self._cells_of_model()[0], self._api_sources)
            for (_, attr), (owner, prefix) in self._custom.items():
                self._patched.restore(owner, attr)
                self._patched.patch(owner, attr, prefix, attr)
            optimizer_step.install()  # one record per parameter update instead of Jit.{Optimizer}
            _state.recording = True
        self._capturing = True

    def _capture_off(self):
        if not self._capturing:
            return
        self._capturing = False
        _state.recording = False  # the API wrappers stay installed, idle (see _end_step)
        optimizer_step.uninstall()
        self._patched.restore_primitives()
        if self._cells is not None:
            self._cells.detach()
        self._sync.exit()

    def _warn_jit(self, jit):
        if self._jit_warned:
            return
        self._jit_warned = True
        from msprobe.mindspore.static_graph import tensor_dump_missing
        missing = tensor_dump_missing()
        if missing is not None:
            names = ", ".join(f"{p} ({type(c).__name__})" for p, c in jit)
            logger.warning("msprobe: jit-compiled Cells %s are recorded at their border in graph/ and "
                           "pynative/; the Cells inside them need mindspore.ops.TensorDump, which this "
                           "MindSpore build cannot run (%s)", names, missing)

    # -- static graph ------------------------------------------------------------------------------
    def _start_static(self, model):
        from msprobe.mindspore.static_graph import start_static
        if self._static is None:
            self._static = start_static(self.config, model, self.current_step)


def _trainable_params(model):
    """The trainable Parameters of a Cell or list/tuple of Cells (none without a model)."""
    if model is None:
        return ()
    return tuple(p for m in (model if isinstance(model, (list, tuple)) else [model]) for p in m.trainable_params())

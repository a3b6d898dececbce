"""PrecisionDebugger for MindSpore: start/stop/step lifecycle over the capture layers.

    start()  -> a DumpSession for the current step (created on first start of the step); L1/mix wrap
                the APIs (and the Primitives of the model passed); L0/mix hook the model's sub-Cells.
    stop()   -> capture off; the session stays so that a backward run after stop() is still recorded.
    step()   -> flush and close the step's files, advance the step counter.

In GRAPH_MODE, start() hands over to static_graph.py (L0 through ops.TensorDump, L2 through
MindSpore's own dump); everything else here is PyNative.
"""

import atexit
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import mindspore as ms

from msprobe.core.config import config_task, load_config
from msprobe.core.grad_probe.config import grad_probe_config_for_debugger
from msprobe.core.errors import ConfigError
from msprobe.core.gc_pause import CollectorPause
from msprobe.mindspore import _state
from msprobe.mindspore.capture.cells import CellCapture, all_cells, jit_cells
from msprobe.mindspore.capture.debug_save import save_variable
from msprobe.mindspore.capture.patched_api import PatchedApis
from msprobe.core.dump.overflow import OverflowBudget
from msprobe.mindspore.session import DumpSession, current_rank

logger = logging.getLogger(__name__)


class PrecisionDebugger:
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

    def __new__(cls, config_path=None, task=None, dump_path=None, level=None, step=None):
        # task grad_probe is gradient monitoring, driven by `.monitor(optimizer)`: hand over to its monitor.
        if config_task(config_path, task) == "grad_probe":
            from msprobe.mindspore.grad_probe import GradientMonitor
            return GradientMonitor(config=grad_probe_config_for_debugger(config_path, dump_path=dump_path, step=step))
        return super().__new__(cls)

    def __init__(self, config_path=None, task=None, dump_path=None, level=None, step=None):
        self.config = load_config(config_path, task=task, dump_path=dump_path, level=level, step=step)
        # overflow_check: overflowing records counted over the whole run, against overflow_nums
        self._overflow = OverflowBudget(self.config.overflow_nums)
        self.current_step = 0
        self._session = None
        self._cells = None
        self._model = None
        self._patched = PatchedApis()
        self._custom = {}  # (id(owner), attr) -> (owner, prefix)
        self._running = False  # between the user's start() and stop()
        self._capturing = False  # capture layers installed (differs from _running under token_range)
        self._rank_id = None
        self._token_range = None
        self._token_handles = []
        self._token_iter = 0
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="msprobe-writer")
        self._save_counts = {}
        self._static = None
        self._jit_warned = False
        self._collector = CollectorPause()  # no cyclic GC from start() to stop(): see core/gc_pause.py
        _state.debugger = self
        atexit.register(self._at_exit)

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
        if ms.get_context("mode") == ms.GRAPH_MODE:
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
        self._check_model(model, token_range)
        if rank_id is not None:
            if isinstance(rank_id, bool) or not isinstance(rank_id, int) or rank_id < 0:
                raise ConfigError("rank_id", rank_id, "an integer >= 0")
            self._rank_id = rank_id
        if token_range is not None:
            self._set_token_range(model, token_range)
        if model is not None:
            self._set_model(model)
        if self._running or not self._step_selected():
            return
        if self._open_session() is None:
            return
        self._running = True
        self._collector.pause()
        if self._token_range is not None and not self._token_active():
            return
        self._session.read_params_early()
        self._capture_on()

    def stop(self):
        """Stop collection; the step's backward is still recorded until step()."""
        if self._running:
            self._capture_off()
            self._running = False
        self._collector.resume()

    def step(self):
        """End the step: flush everything to disk and advance the step counter."""
        self.stop()
        self._close_session()
        if self._cells is not None:
            self._cells.release()
        if self._static is not None:
            self._static.step()
        self.current_step += 1
        self._token_iter = 0
        self._save_counts = {}

    def set_init_step(self, step):
        """Count steps from `step` (call before the training loop)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError("step", step, "an integer >= 0")
        self.current_step = step
        if self._session is not None and self._session.writer is None:
            self._session.step = step  # start(model) ran before Model.train: nothing written yet

    def save(self, variable, name, save_backward=True):
        """Save a tensor or nested dict/list/tuple/scalars under `name` (level debug): debug.json."""
        if self.config.level != "debug":
            raise ConfigError("level", self.config.level, "debug (save() records only at level debug)")
        if not isinstance(name, str) or not name:
            raise ConfigError("name", name, "a non-empty string")
        if not self._step_selected() or self._open_session() is None:
            return
        count = self._save_counts.get(name, 0)
        self._save_counts[name] = count + 1
        save_variable(self._session, variable, name, count, save_backward)

    def register_custom_api(self, module, api, api_prefix):
        """Record `module.api` at L1 as `{api_prefix}.{api}.{n}`."""
        if not isinstance(api, str) or not callable(getattr(module, api, None)):
            raise ConfigError("api", api, f"the name of a callable attribute of {module!r}")
        if not isinstance(api_prefix, str) or not api_prefix:
            raise ConfigError("api_prefix", api_prefix, "a non-empty string (the prefix of the dump keys)")
        self._custom[(id(module), api)] = (module, api_prefix)
        if self._capturing:
            self._patched.restore(module, api)
            self._patched.patch(module, api, api_prefix, api)

    def restore_custom_api(self, module, api):
        """Undo register_custom_api: the original callable is put back."""
        self._custom.pop((id(module), api), None)
        self._patched.restore(module, api)

    def close(self):
        """Stop and flush (also runs at interpreter exit)."""
        self.stop()
        self._close_session()
        if self._cells is not None:
            self._cells.release()
        for h in self._token_handles:
            h.remove()
        self._token_handles = []
        self._token_range = None

    # -- internals -----------------------------------------------------------------------------
    def _check_model(self, model, token_range):
        level = self.config.level
        if model is None:
            if level in ("L0", "mix"):
                raise ConfigError("model", None, f"a mindspore.nn.Cell or a list/tuple of them (level {level} "
                                  "records Cells; pass start(model))")
            if token_range is not None:
                raise ConfigError("model", None, "a mindspore.nn.Cell when token_range is given")
            return
        cells = model if isinstance(model, (list, tuple)) else [model]
        if not cells or not all(isinstance(c, ms.nn.Cell) for c in cells):
            raise ConfigError("model", type(model).__name__,
                              "a mindspore.nn.Cell or a list/tuple of mindspore.nn.Cell")

    def _set_model(self, model):
        if model is self._model:
            return
        if self._capturing:
            self._capture_off()
            self._running = False  # start() goes on to capture with the new model
        if self._cells is not None:
            self._cells.release()
            self._cells = None
        self._model = model
        self._share_params()

    def _share_params(self):
        """Tell the step's session(s) which Parameters to read together (DumpSession.param_record)."""
        if self._session is None:
            return
        params = _trainable_params(self._model)
        for session in (self._session, self._session.graph):
            if session is not None:
                session.params_changed()
                session.model_params = params

    def _step_selected(self):
        steps = self.config.step
        return not steps or self.current_step in steps

    def _open_session(self):
        if self._session is None:
            rank = self._rank_id if self._rank_id is not None else current_rank()
            if self.config.rank and (rank is None or rank not in self.config.rank):
                return None
            cfg = self.config
            jit = jit_cells(self._model) if cfg.level in ("L0", "mix") and self._model is not None else []
            if jit:
                # seed 000: a jit-compiled Cell at L0/mix splits the dump into graph/ and pynative/
                self._session = DumpSession(cfg, self.current_step, rank, pool=self._pool,
                                            dump_path=os.path.join(cfg.dump_path, "pynative"),
                                            overflow=self._overflow)
                self._session.graph = DumpSession(cfg, self.current_step, rank, pool=self._pool,
                                                  dump_path=os.path.join(cfg.dump_path, "graph"),
                                                  overflow=self._overflow)
                self._warn_jit(jit)
            else:
                self._session = DumpSession(cfg, self.current_step, rank, pool=self._pool,
                                            overflow=self._overflow)
            self._share_params()
            logger.info("msprobe: dumping step %d to %s", self.current_step, self.config.dump_path)
        _state.session = self._session
        return self._session

    def _close_session(self):
        session, self._session = self._session, None
        if _state.session is session:
            _state.session = None
        if session is not None:
            session.close()

    def _capture_on(self):
        if self._capturing:
            return
        level = self.config.level
        if level in ("L0", "mix"):
            if self._cells is None:
                self._cells = CellCapture(self._model)
            self._cells.attach()
        if level in ("L1", "mix"):
            self._patched.patch_builtin()
            self._patched.patch_jit()
            if self._model is not None:
                self._patched.patch_primitives(all_cells(self._model))
            for (_, attr), (owner, prefix) in self._custom.items():
                self._patched.restore(owner, attr)
                self._patched.patch(owner, attr, prefix, attr)
        self._capturing = True

    def _capture_off(self):
        if not self._capturing:
            return
        self._capturing = False
        self._patched.restore()
        if self._cells is not None:
            self._cells.detach()

    # -- token_range -------------------------------------------------------------------------------
    def _set_token_range(self, model, token_range):
        if (not isinstance(token_range, (list, tuple)) or len(token_range) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in token_range)
                or token_range[0] > token_range[1]):
            raise ConfigError("token_range", token_range, "[start, end] with integers 0 <= start <= end")
        if self._token_handles:
            return
        self._token_range = tuple(token_range)
        root = model[0] if isinstance(model, (list, tuple)) else model
        self._token_handles = [root.register_forward_pre_hook(self._on_token),
                               root.register_forward_hook(self._after_token)]

    def _token_active(self):
        lo, hi = self._token_range
        return lo <= self._token_iter <= hi

    def _on_token(self, cell, args):
        if self._session is not None and self._running and self._token_active():
            self._capture_on()

    def _after_token(self, cell, args, output):
        if self._session is not None and self._running and self._token_active():
            self._capture_off()
        self._token_iter += 1

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

    def _at_exit(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: never mask the user's own exit
            logger.exception("msprobe: flushing the dump at exit failed")
        self._pool.shutdown(wait=True)


def _trainable_params(model):
    """The trainable Parameters of a Cell or list/tuple of Cells (none without a model)."""
    if model is None:
        return ()
    return tuple(p for m in (model if isinstance(model, (list, tuple)) else [model]) for p in m.trainable_params())

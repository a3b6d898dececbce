"""PrecisionDebugger for PyTorch: start/stop/step lifecycle over the capture layers.

    start()  -> a DumpSession for the current step (created on first start of the step); L1/mix enter
                the ApiCapture mode and wrap collectives; L0/mix hook the model's submodules.
    stop()   -> capture off; the session stays so that a backward run after stop() is still recorded.
    step()   -> flush and close the step's files, advance the step counter.
"""

import atexit
import logging
from concurrent.futures import ThreadPoolExecutor

import torch

from msprobe.core.config import config_task, load_config
from msprobe.core.grad_probe.config import grad_probe_config_for_debugger
from msprobe.core.errors import ConfigError, MsprobeError
from msprobe.core.gc_pause import CollectorPause
from msprobe.pytorch import _state
from msprobe.pytorch.capture.api_mode import ApiCapture
from msprobe.pytorch.capture.aten_mode import AtenCapture
from msprobe.pytorch.capture.debug_save import save_variable
from msprobe.pytorch.capture.modules import ModuleCapture
from msprobe.pytorch.capture.patched_api import PatchedApis
from msprobe.core.dump.overflow import OverflowBudget
from msprobe.pytorch.session import DumpSession, current_rank

logger = logging.getLogger(__name__)


class PrecisionDebugger:
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

    def __new__(cls, config_path=None, task=None, dump_path=None, level=None, step=None):
        # task grad_probe is gradient monitoring, driven by `.monitor(model)`: hand over to its monitor.
        if config_task(config_path, task) == "grad_probe":
            from msprobe.pytorch.grad_probe import GradientMonitor
            return GradientMonitor(config=grad_probe_config_for_debugger(config_path, dump_path=dump_path, step=step))
        return super().__new__(cls)

    def __init__(self, config_path=None, task=None, dump_path=None, level=None, step=None):
        self.config = load_config(config_path, task=task, dump_path=dump_path, level=level, step=step)
        # overflow_check: overflowing records counted over the whole run, against overflow_nums
        self._overflow = OverflowBudget(self.config.overflow_nums)
        self.current_step = 0
        self._session = None
        self._api_capture = None
        self._aten_capture = None
        self._modules = None
        self._model = None
        self._patched = PatchedApis()
        self._custom = {}  # (module, attr) -> (prefix, name)
        self._running = False  # between the user's start() and stop()
        self._capturing = False  # capture layers installed (differs from _running under token_range)
        self._rank_id = None
        self._token_range = None
        self._token_handles = []
        self._token_iter = 0
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="msprobe-writer")
        self._save_counts = {}
        self._optim_handles = []
        self._collector = CollectorPause()  # no cyclic GC from start() to stop(): see core/gc_pause.py
        atexit.register(self._at_exit)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, model=None, token_range=None, rank_id=None):
        """Start (or resume, within a step) collection.

        Args:
            model: nn.Module or list/tuple of them; required for L0 and mix, and for token_range.
            token_range: [start, end] forward iterations of `model` to dump (autoregressive decoding).
            rank_id: names the rank{ID} folder instead of torch.distributed's rank.
        """
        cfg = self.config
        if cfg.level == "debug":
            return
        self._check_model(model, token_range)
        if rank_id is not None:
            if isinstance(rank_id, bool) or not isinstance(rank_id, int) or rank_id < 0:
                raise ConfigError("rank_id", rank_id, "an integer >= 0")
            self._rank_id = rank_id
        if token_range is not None:
            self._set_token_range(model, token_range)
        if self._running or not self._step_selected():
            return
        session = self._open_session()
        if session is None:
            return
        self._collector.pause()
        if self._token_range is not None and not self._token_active():
            self._running = True
            return
        self._capture_on(model)

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
        if self._modules is not None:
            self._modules.end_step()
        self.current_step += 1
        self._token_iter = 0
        self._save_counts = {}

    def set_init_step(self, step):
        """Count steps from `step` (call before the training loop)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError("step", step, "an integer >= 0")
        self.current_step = step

    def save(self, variable, name, save_backward=True):
        """Save a tensor or nested dict/list/tuple/scalars under `name` (level debug): debug.json."""
        if self.config.level != "debug":
            raise ConfigError("level", self.config.level, "debug (save() records only at level debug)")
        if not isinstance(name, str) or not name:
            raise ConfigError("name", name, "a non-empty string")
        if not self._step_selected():
            return
        session = self._open_session()
        if session is None:
            return
        count = self._save_counts.get(name, 0)
        self._save_counts[name] = count + 1
        save_variable(session, variable, name, count, save_backward)

    def register_custom_api(self, module, api, api_prefix=None):
        """Record `module.api` at L1 as `{api_prefix}.{api}.{n}` (prefix defaults to the module name)."""
        if not isinstance(api, str) or not hasattr(module, api):
            raise ConfigError("api", api, f"the name of a callable attribute of {module!r}")
        prefix = api_prefix or getattr(module, "__name__", type(module).__name__).rsplit(".", 1)[-1]
        self._custom[(module, api)] = prefix
        if self._running:
            self._patched.patch(module, api, prefix, api)

    def restore_custom_api(self, module, api):
        """Undo register_custom_api: the original callable is put back."""
        self._custom.pop((module, api), None)
        self._patched.restore(module, api)

    def close(self):
        """Stop and flush (also runs at interpreter exit)."""
        self.stop()
        self._close_session()
        if self._modules is not None:
            self._modules.release()
        for h in self._token_handles:
            h.remove()
        self._token_handles = []
        self._token_range = None

    # -- internals -----------------------------------------------------------------------------
    def _check_model(self, model, token_range):
        level = self.config.level
        if model is None:
            if level in ("L0", "mix"):
                raise ConfigError("model", None, f"an nn.Module or a list/tuple of them (level {level} "
                                  "records modules; pass start(model))")
            if token_range is not None:
                raise ConfigError("model", None, "an nn.Module when token_range is given")
            return
        mods = model if isinstance(model, (list, tuple)) else [model]
        if not mods or not all(isinstance(m, torch.nn.Module) for m in mods):
            raise ConfigError("model", type(model).__name__, "an nn.Module or a list/tuple of nn.Module")

    def _step_selected(self):
        steps = self.config.step
        return not steps or self.current_step in steps

    def _open_session(self):
        if self._session is None:
            rank = self._rank_id if self._rank_id is not None else current_rank()
            if self.config.rank and (rank is None or rank not in self.config.rank):
                return None
            self._session = DumpSession(self.config, self.current_step, rank, pool=self._pool,
                                        overflow=self._overflow)
            logger.info("msprobe: dumping step %d to %s", self.current_step, self.config.dump_path)
        _state.session = self._session
        return self._session

    def _close_session(self):
        session, self._session = self._session, None
        if _state.session is session:
            _state.session = None
        if session is not None:
            session.close()

    def _capture_on(self, model):
        level = self.config.level
        if level in ("L0", "mix"):
            if self._modules is None or model is not self._model:
                if self._modules is not None:
                    self._modules.release()
                self._modules, self._model = ModuleCapture(model), model
            self._modules.attach()
        if level in ("L1", "mix", "L2"):
            if self._api_capture is None:
                self._api_capture = ApiCapture()
            if self._capturing:
                return
            self._api_capture.__enter__()
            if level == "L2":  # entered after ApiCapture: the API handler runs first, then aten below it
                if self._aten_capture is None:
                    self._aten_capture = AtenCapture()
                self._aten_capture.__enter__()
            else:
                self._patched.patch_collectives()
                for (module, api), prefix in self._custom.items():
                    self._patched.patch(module, api, prefix, api)
        if level == "mix" and not self._optim_handles:
            # APIs run by optimizer.step() get "optimizer" as their parent in construct.json
            from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                               register_optimizer_step_pre_hook)
            self._optim_handles = [register_optimizer_step_pre_hook(self._optim_enter),
                                   register_optimizer_step_post_hook(self._optim_exit)]
        self._capturing = True
        self._running = True

    def _optim_enter(self, optimizer, args, kwargs):
        if self._session is not None:
            self._session.in_optimizer = True

    def _optim_exit(self, optimizer, args, kwargs):
        if self._session is not None:
            self._session.in_optimizer = False

    def _capture_off(self):
        if not self._capturing:
            return
        self._capturing = False
        if self._api_capture is not None and self.config.level in ("L1", "mix", "L2"):
            try:
                if self.config.level == "L2":
                    self._aten_capture.__exit__(None, None, None)
                self._api_capture.__exit__(None, None, None)
            except Exception as e:  # another mode was pushed after ours and not popped
                raise MsprobeError(f"stop(): could not leave msprobe's capture mode ({e}); "
                                   "exit modes entered after start() before calling stop()") from None
            self._patched.restore()
        if self._modules is not None:
            self._modules.detach()
        for h in self._optim_handles:
            h.remove()
        self._optim_handles = []

    # -- token_range -------------------------------------------------------------------------------
    def _set_token_range(self, model, token_range):
        if (not isinstance(token_range, (list, tuple)) or len(token_range) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in token_range)
                or token_range[0] > token_range[1]):
            raise ConfigError("token_range", token_range, "[start, end] with integers 0 <= start <= end")
        if self._token_handles:
            return
        self._token_range = tuple(token_range)
        roots = model if isinstance(model, (list, tuple)) else [model]
        self._token_handles = [roots[0].register_forward_pre_hook(self._on_token),
                               roots[0].register_forward_hook(self._after_token)]

    def _token_active(self):
        lo, hi = self._token_range
        return lo <= self._token_iter <= hi

    def _on_token(self, module, args):
        if self._session is not None and self._running and self._token_active():
            self._capture_on(self._model or module)

    def _after_token(self, module, args, output):
        if self._session is not None and self._running and self._token_active():
            self._capture_off()
        self._token_iter += 1

    def _at_exit(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: never mask the user's own exit
            logger.exception("msprobe: flushing the dump at exit failed")
        self._pool.shutdown(wait=True)




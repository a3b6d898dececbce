"""The start/stop/step lifecycle that PyTorch's and MindSpore's PrecisionDebugger share.

    start()  -> a DumpSession for the current step (made at the step's first start()), then the
                adapter's capture layers on; token_range and rank_id are checked and kept here.
    stop()   -> capture off; the session stays, so a backward run after stop() is still recorded.
    step()   -> flush and close the step's files, advance the step counter.
    close()  -> flush, and let go of the model and the writer threads (start(model) takes them up
                again). The exit hook that flushes a step left open is registered only while one
                is: an idle debugger is held by nothing but its user.

An adapter subclasses DumpLifecycle and supplies what only it knows: which models it accepts, how a
session and the rank are made, and its capture layers (`_capture_on`, `_capture_off`,
`_release_capture`, `_on_new_model`). Framework-free: imports neither torch nor mindspore.
"""

import logging
import weakref
from concurrent.futures import ThreadPoolExecutor

from msprobe.core.config import config_task, load_config
from msprobe.core.dump import flusher
from msprobe.core.dump.overflow import OverflowBudget
from msprobe.core.dump.run_report import RunReport
from msprobe.core.dump.writer import DumpExistsError, DumpWriter
from msprobe.core.errors import ConfigError, MsprobeError
from msprobe.core.exit_hook import ExitHook
from msprobe.core.gc_pause import CollectorPause
from msprobe.core.grad_probe.config import grad_probe_config_for_debugger
from msprobe.core.safe_files import check_output_dir

logger = logging.getLogger(__name__)


class DumpLifecycle:
    """Base of the frameworks' PrecisionDebugger.

    Class attributes an adapter sets:
        state: its import-free module whose `session` the capture hooks read.
        model_types: the classes start(model) accepts (a model may also be a list/tuple of them).
        model_words: how errors name them, e.g. "an nn.Module".
        unit_words: what L0 records, e.g. "modules".
    """

    state = None
    model_types = ()
    model_words = ""
    unit_words = ""

    def __new__(cls, config_path=None, task=None, dump_path=None, level=None, step=None):
        # task grad_probe is gradient monitoring, driven by the monitor's own calls: hand over to it
        try:
            if config_task(config_path, task) == "grad_probe":
                monitor = cls._gradient_monitor_class()
                return monitor(config=grad_probe_config_for_debugger(config_path, dump_path=dump_path, step=step))
        except MsprobeError as e:  # the message, raised from the user's call, not a trace through msprobe
            raise e.with_traceback(None) from None
        return super().__new__(cls)

    def __init__(self, config_path=None, task=None, dump_path=None, level=None, step=None):
        try:
            self.config = load_config(config_path, task=task, dump_path=dump_path, level=level, step=step)
            check_output_dir(self.config.dump_path, "dump_path")  # not a file, a link, read-only
        except MsprobeError as e:
            raise e.with_traceback(None) from None
        # overflow_check: overflowing records counted over the whole run, against overflow_nums
        self._overflow = OverflowBudget(self.config.overflow_nums)
        self.current_step = 0
        self._session = None
        self._model = None
        self._custom = {}  # (id(owner), attr) -> (owner, prefix): register_custom_api
        self._running = False  # between the user's start() and stop()
        self._capturing = False  # capture layers installed (differs from _running under token_range)
        self._rank_id = None
        self._token_range = None
        self._token_handles = []
        self._token_iter = 0
        self._pool = None  # the writer threads: see _writer_pool
        self._lane = None  # the thread that completes and writes records resolved from a device: _writer_lane
        self._save_counts = {}
        self._failure = None  # what stopped the run's dump (a full disk, another run's directory)
        self._collector = CollectorPause()  # no cyclic GC from start() to stop(): see core/gc_pause.py
        # close() at interpreter exit flushes a step still open: held from its session's opening to
        # step() or close() only, since it keeps the debugger, and with it the model, alive
        self._exit_hook = ExitHook()
        # where the dump goes, and filters that matched nothing: said at close() or exit (the report holds
        # nothing of the debugger)
        self._report = RunReport(self.config)
        weakref.finalize(self, self._report.finish)

    # -- what an adapter supplies ----------------------------------------------------------------
    @classmethod
    def _gradient_monitor_class(cls):
        raise NotImplementedError

    def _new_session(self, rank):
        """The DumpSession of the current step for `rank`."""
        raise NotImplementedError

    def _current_rank(self):
        raise NotImplementedError

    def _save_variable(self, session, variable, name, count, save_backward):
        raise NotImplementedError

    def _on_new_model(self):
        """`self._model` was replaced: drop what was set up for the previous one."""


    def _capture_on(self):
        """Install the capture layers for the config's level (also called again under token_range)."""
        raise NotImplementedError

    def _capture_off(self):
        raise NotImplementedError

    def _release_capture(self):
        """Remove what stays installed across steps (e.g. module hooks)."""

    # -- the user's calls ------------------------------------------------------------------------
    def _start_dump(self, model, token_range, rank_id):
        """The common part of start(): checks, the step's session, then capture (unless token_range
        says this forward iteration is not dumped)."""
        self._check_model(model, token_range)
        if rank_id is not None:
            if isinstance(rank_id, bool) or not isinstance(rank_id, int) or rank_id < 0:
                raise ConfigError("rank_id", rank_id, "an integer >= 0")
            self._rank_id = rank_id
        if token_range is not None:
            self._set_token_range(model, token_range)
        if model is not None and model is not self._model:
            if self._capturing:
                self._capture_off()
                self._running = False  # capture goes on below, with the new model
            self._model = model
            self._on_new_model()
        self._report.started(self.current_step, self._step_selected())
        if self._running or not self._step_selected() or self._open_session() is None:
            return
        self._running = True
        self._collector.pause()
        if self._token_range is not None and not self._token_active():
            return
        self._capture_on()

    def stop(self):
        """Stop collection; the step's backward is still recorded until step(). What was recorded so far
        is resolved and written (on a device: without waiting for it)."""
        self._stop_capture()
        self._collector.resume()

    def _stop_capture(self):
        if self._running:
            self._capture_off()
            self._running = False
            if self._session is not None:
                self._session.resolve()
                self._session.summarizer.clear()

    def step(self):
        """End the step: flush everything to disk and advance the step counter."""
        # paused again (stop() resumed it): a collection while the session closes would walk the
        # step's objects, which the close frees
        self._collector.pause()
        self._stop_capture()
        try:
            self._close_session()
        finally:
            # resumed once the step's objects are gone: before, its first young collection would walk
            # them all (and promote them)
            self._collector.resume()
        self._exit_hook.drop()
        next_dumped = self._step_selected(self.current_step + 1)
        self._end_step(next_dumped)
        if not next_dumped:
            self._stop_pool()  # no writer thread waits through a step that is not dumped
        self.current_step += 1
        self._token_iter = 0
        self._save_counts = {}

    def _end_step(self, next_dumped):
        """Adapter work at step end, after the session is closed. `next_dumped`: the next step is dumped
        too, so capture layers may stay installed, idle, until it starts."""

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
        self._save_variable(session, variable, name, count, save_backward)

    def restore_custom_api(self, module, api):
        """Undo register_custom_api: the original callable is put back."""
        self._custom.pop((id(module), api), None)
        self._patched.restore(module, api)

    def close(self):
        """Stop and flush (also runs at interpreter exit). The debugger then holds no reference to the
        model, no thread and no exit hook; a later start() needs the model again."""
        self.stop()
        self._close_session()
        self._release_capture()
        for h in self._token_handles:
            h.remove()
        self._token_handles = []
        self._token_range = None
        if self._model is not None:
            self._model = None
            self._on_new_model()  # the adapter drops what it set up for the model
        self._stop_pool()
        self._exit_hook.drop()
        self._report.finish()

    # -- internals -------------------------------------------------------------------------------
    def _check_model(self, model, token_range):
        level, words = self.config.level, self.model_words
        if model is None:
            if level in ("L0", "mix"):
                raise ConfigError("model", None, f"{words} or a list/tuple of them (level {level} "
                                  f"records {self.unit_words}; pass start(model))")
            if token_range is not None:
                raise ConfigError("model", None, f"{words} when token_range is given")
            return
        units = model if isinstance(model, (list, tuple)) else [model]
        if not units or not all(isinstance(u, self.model_types) for u in units):
            raise ConfigError("model", type(model).__name__, f"{words} or a list/tuple of them")

    def _step_selected(self, step=None):
        """Whether `step` (default: the current one) is dumped by the config's step filter."""
        steps = self.config.step
        return not steps or (self.current_step if step is None else step) in steps

    def _writer_pool(self):
        """The sessions' thread pool (opening a step's files, tensor files, checksums), started by the
        first session of a run of dumped steps and stopped before a step that is not dumped."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="msprobe-writer")
        return self._pool

    def _writer_lane(self):
        """One thread that, in order, waits for summaries read back from a device and writes their
        records (CaptureSession.resolve); started and stopped with the writer pool."""
        if self._lane is None:
            self._lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="msprobe-lane")
        return self._lane

    def _stop_pool(self):
        for name in ("_lane", "_pool"):
            pool = getattr(self, name)
            if pool is not None:
                pool.shutdown(wait=True)
                setattr(self, name, None)
        flusher.release()  # (it waits between dumped steps: flusher.py)

    def _open_session(self):
        if self._failure is not None:
            return None  # the dump stopped (said once); training goes on
        if self._session is None:
            rank = self._rank_id if self._rank_id is not None else self._current_rank()
            if self.config.rank and (rank is None or rank not in self.config.rank):
                self._report.rank_refused(rank)
                return None
            try:
                session = self._new_session(rank)
            except DumpExistsError as e:
                if not self._report.sessions:  # the run's first step: refused, before anything is written
                    raise e.with_traceback(None) from None
                self._dump_failed(None, e)  # a later step: stop dumping, as for a full disk
                return None
            self._exit_hook.hold(self._at_exit)
            self._session = session
            for s in (session, getattr(session, "graph", None)):
                if s is not None:
                    s.on_failure = self._dump_failed
            self._session.announce = self._report.announce
            self._report.session_opened()
            logger.info("msprobe: dumping step %d to %s", self.current_step, self.config.dump_path)
        self.state.session = self._session
        return self._session

    def _dump_failed(self, session, error):
        """A session could not write (any thread): said once; no more dumping in this run."""
        if self._failure is None:
            self._failure = error
            if session is None:
                where = ""
            elif isinstance(session.writer, DumpWriter):
                where = f" (step {session.step}: its dump.json is marked incomplete)"
            else:
                where = f" (step {session.step}: not written)"
            if isinstance(error, OSError) and error.errno is None:  # numpy's short write names no cause
                error = f"{error} (a short write: the disk may be full)"
            logger.warning("msprobe: stopped dumping for the rest of this run, training goes on: %s%s", error, where)
        if session is not None and self.state.session is session:
            self.state.session = None

    def _close_session(self):
        session, self._session = self._session, None
        if self.state.session is session:
            self.state.session = None
        if session is not None:
            session.close()
            self._report.session_closed(session)

    # -- token_range: which forward iterations of the model are dumped -----------------------------
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

    def _on_token(self, model, args):
        if self._session is not None and self._running and self._token_active():
            self._capture_on()

    def _after_token(self, model, args, output):
        if self._session is not None and self._running and self._token_active():
            self._capture_off()
        self._token_iter += 1

    def _at_exit(self):
        self._report.quiet()  # a script that died says its own error, and only that
        try:
            self.close()
        except Exception:  # interpreter shutdown: never mask the user's own exit
            logger.exception("msprobe: flushing the dump at exit failed")

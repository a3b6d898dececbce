"""DumpSession: everything recorded in one step of one rank — turns calls into records for the writer.

The capture layers (wrapped APIs, Cell hooks, GradTracker, debug save) call into the session; the
session owns naming counters, filters, statistics and the writer (all from msprobe.core but the
statistics). Hot path: `record_call`.
"""

import threading
import weakref
from concurrent.futures import Future

import mindspore as ms
import numpy as np

from msprobe.core import naming
from msprobe.core.dump.json_append import scalar_record
from msprobe.core.dump.records import CallRecords, common_value_record
from msprobe.core.dump.tensor_files import save_npy
from msprobe.core.dump.writer import SessionWriter
from msprobe.core.filters import DumpFilter
from msprobe.core.stack import capture_stack
from msprobe.mindspore import _state
from msprobe.mindspore.capture.backward import GradTracker, grad_recording
from msprobe.mindspore.overflow import OverflowGate
from msprobe.mindspore.statistics import Summarizer, host_array

_SCALARS = (int, float, bool, str)


class DumpSession(CallRecords, SessionWriter):
    """Recording state for one step of one rank.

    Args:
        cfg: validated DumpConfig.
        step: the step number (names the step{N} directory).
        rank: rank number for rank{R}, or None for proc{pid}.
        pool: shared writer thread pool.
        dump_path: directory holding the step dirs (default cfg.dump_path; jit splits graph/pynative).
        overflow: the run's OverflowBudget (task overflow_check): records pass an OverflowGate.
    """

    framework = "mindspore"

    def __init__(self, cfg, step, rank, pool=None, dump_path=None, overflow=None):
        self.cfg = cfg
        self.step = step
        self.rank = rank
        self.pool = pool
        self.dump_path = dump_path or cfg.dump_path
        self.filter = DumpFilter(cfg)
        self.counter = naming.CallCounter()
        self.summarizer = Summarizer(stats=cfg.wants_stats, md5=cfg.summary_mode == "md5")
        self.module_stack = []  # forward keys of the Cells being run, innermost last
        # The step's files open at the first record, not early on the pool as in PyTorch: a pool thread
        # opening them while PyNative ops run made the transformer of benchmarks/ms_dump_overhead.py
        # ~1.5 ms a step slower at L0 and L1 (A/B of 6 process pairs, synchronous; the GIL changes
        # hands at every op)
        self._prepare_writer(pool, early=False)
        self.trackers = {}  # backward trackers still waiting for gradients, in creation order
        self.recorded_cells = set()  # "Cell.{path}.{Class}" recorded in forward this step
        self.with_stack = cfg.extra_info
        self.tensor_count = 0
        self.graph = None  # the graph/ session when jit-compiled Cells are recorded (L0/mix)
        self.stuck = {}  # trackers with every output gradient in and some input gradient missing
        self._seq = 0
        self._late = []  # (tensor, record, file stem, save, future): summarised in one batch later
        # defer every tensor's statistics (not only gradients) until a batch point; off for level debug,
        # whose records go out one by one
        self.defer = cfg.level != "debug"
        self._after_backward = False  # gradients were queued: the next forward call summarises the batch
        self.gate = OverflowGate(overflow) if cfg.task == "overflow_check" and overflow is not None else None
        # the model's trainable Parameters (set by the debugger): their statistics are read together
        self.model_params = ()
        # the read is dropped when a gradient arrives: L0/mix see every Parameter gradient through their
        # hooks, L1 only through the backward records of recorded calls
        self._params_tracked = cfg.level in ("L0", "mix") or (self.filter.backward and self.filter.passes_everything)
        self._param_recs = None  # id(p) -> (weakref to p, record), or None: not read since the last change
        self.tensor_hooks = []  # handles of Tensor.register_hook (in-place calls), removed at step end
        # ops run synchronously while capturing (set at each start): tensor hooks are then the cheap
        # way to see gradients; in the asynchronous pipeline each one waits (capture/backward.py)
        self.synchronous = False

    # -- writer ----------------------------------------------------------------------------------
    def renumber(self, step):
        """The session's step number, changed before anything was written (MsprobeInitStep after start)."""
        self.step = step
        if self.graph is not None:
            self.graph.renumber(step)

    def emit(self, key, record, waits=(), check=None):
        """Hand a finished record to the writer; overflow_check: to the gate, which looks at `check`
        (default: the whole record) once the batch's statistics are in."""
        if self.gate is not None:
            self.gate.offer(key, record, record if check is None else check, waits)
            return
        w = self._writer()
        if self.cfg.task == "structure":
            return
        w.add(key, record, waits)

    def saves_tensor(self, key):
        """Tensor files for `key`? overflow_check: always, written only if the record is kept."""
        return self.gate is not None or self.filter.saves_tensor(key)

    @property
    def overflow_done(self):
        """overflow_check with overflow_nums reached: nothing more is recorded."""
        return self.gate is not None and self.gate.budget.exhausted

    def _keep_overflow(self, key, record, files):
        """OverflowGate callback: write an overflowing record and its tensor files."""
        w = self._writer()
        waits = []
        for rec, value, stem in files:
            arr = value if isinstance(value, np.ndarray) else host_array(value)
            name = stem + ".npy"
            path = w.tensor_path(name)
            waits.append(w.submit(lambda path=path, arr=arr: save_npy(path, arr), arr.nbytes))
            rec["data_name"] = name
            self.tensor_count += 1
        w.add(key, record, waits)

    def settle_overflow(self):
        if self.gate is not None:
            prev, _state.busy = _state.busy, True  # reading tensors must not be recorded
            try:
                self.gate.settle(self._keep_overflow)
            finally:
                _state.busy = prev

    def note_structure(self, key, parent, stack):
        if self.gate is not None:
            self.gate.on_keep(key, lambda: self._note_structure_now(key, parent, stack))
            return
        self._note_structure_now(key, parent, stack)

    def _note_structure_now(self, key, parent, stack):
        w = self._writer()
        if self.cfg.extra_info and (self.cfg.level in ("mix", "L0") or parent is not None):
            w.add_construct(key, parent)
        if stack is not None:
            w.add_stack(key, stack)

    # -- values -> records -----------------------------------------------------------------------
    def tensor_record(self, t, file_stem, save, waits):
        """Record of tensor `t`, filled in later (see deferred_record) when deferring, else now.
        Parameters are read now (the optimizer changes them in place before a later batch would read
        them); the model's trainable ones all at once (see param_record)."""
        if not isinstance(t, ms.Parameter):
            if self.defer:
                return self.deferred_record(t, file_stem, save, waits)
        elif not save:
            rec = self.param_record(t)
            if rec is not None:
                return rec
        return self.tensor_record_now(t, file_stem, save, waits)

    def param_record(self, p):
        """Record of the model's trainable Parameter `p` from one read of them all, or None for another
        Parameter. Reading any tensor makes MindSpore finish every op queued so far; reading each
        Parameter as its Cell ends did that once per Cell and serialised the forward pass. Trainable
        Parameters change only when the optimizer runs, after their gradients: a gradient (see
        params_changed) or an in-place call on them drops the read, and the next use reads them again."""
        recs = self._param_recs
        if recs is None:
            # not p.requires_grad: Parameter.requires_grad waits for every queued op (param_info);
            # a Parameter that is not trainable is simply not among model_params
            if not self.model_params or not self._params_tracked:
                return None
            recs = self._param_recs = self._read_params()
        hit = recs.get(id(p))
        if hit is None or hit[0]() is not p:
            return None
        return dict(hit[1])

    def read_params_early(self):
        """At start(), before the forward pass queues work: read the trainable Parameters that
        param_record will be asked for. Read at the first Cell's end instead, this waited for every op
        queued until then (asnumpy finishes them all). Only when every call is recorded without tensor
        files (otherwise param_record is not used, or a filter may never ask)."""
        flt = self.filter
        if (self._param_recs is not None or not self.model_params or not self._params_tracked
                or not flt.forward or not flt.passes_everything or flt.saves_all_tensors or flt.tensor_list
                or self.gate is not None):
            return
        self._param_recs = self._read_params()

    def _read_params(self):
        recs = {}
        prev, _state.busy = _state.busy, True
        try:
            for p in self.model_params:  # trainable (see _trainable_params)
                if id(p) not in recs:
                    recs[id(p)] = (weakref.ref(p), self.summarizer.summarize(p)[0])
        finally:
            _state.busy = prev
        return recs

    def params_changed(self, tensors=None):
        """The optimizer may change the Parameters from now on (`tensors`: only these changed): drop
        their statistics read by param_record, here and in the summarizer's cache."""
        recs = self._param_recs
        if not recs:
            return
        if tensors is None:
            self._param_recs = None
            self.summarizer.forget([ref() for ref, _ in recs.values()])
            return
        for t in tensors:
            recs.pop(id(t), None)

    def tensor_record_now(self, t, file_stem, save, waits, into=None):
        """Record of tensor `t` now (filling in `into` when given)."""
        rec, arr = self.summarizer.summarize(t)
        if into is not None:
            into.update(rec)
            rec = into
        if save and self.gate is not None:
            # the file is written only if the record overflows; a Parameter is copied now, as the
            # optimizer changes it in place before the gate decides
            self.gate.note_tensor(rec, (host_array(t) if arr is None else arr.copy())
                                  if isinstance(t, ms.Parameter) else t, file_stem)
        elif save:
            w = self._writer()
            name = file_stem + ".npy"
            path = w.tensor_path(name)
            arr = host_array(t) if arr is None else arr.copy()  # written later, on the pool
            waits.append(w.submit(lambda: save_npy(path, arr), arr.nbytes))
            rec["data_name"] = name
            self.tensor_count += 1
        return rec

    def deferred_record(self, t, file_stem, save, waits):
        """Record of a tensor summarised later, in one batch (at the next forward call after a backward
        pass, before an in-place call, at the step end, or when many are waiting). Reading a tensor —
        even its dtype — makes MindSpore's PyNative pipeline spin until the op that makes it has run;
        doing that per call, and inside the backward pass, doubled the step time. The writer holds the
        record (and every later one) until it is filled in."""
        rec = {}
        fut = LateFuture()
        self._late.append((t, rec, file_stem, save, fut))
        waits.append(fut)
        if len(self._late) > LATE_LIMIT:
            self.resolve_late()
        return rec

    def gradient_record(self, g, file_stem, save, waits):
        """deferred_record for a gradient: the batch is summarised at the next forward call."""
        self._after_backward = True
        if self._param_recs:
            self.params_changed()
        return self.deferred_record(g, file_stem, save, waits)

    def resolve_late(self):
        """Summarise the tensors deferred_record queued."""
        late, self._late, self._after_backward = self._late, [], False
        for g, rec, stem, save, fut in late:
            waits = []
            try:
                self.tensor_record_now(g, stem, save, waits, into=rec)
            except Exception as e:  # the writer logs it to dump_error_info.log
                fut.set_exception(e)
                continue
            if waits:
                chain = _all_done(waits)
                chain.add_done_callback(lambda f, fut=fut: _copy_outcome(f, fut))
            else:
                fut.set_result(None)
        self.summarizer.drop_aliases()
        self.settle_overflow()

    def value_record(self, v, file_stem, save, waits):
        """Record of any argument/output value; nested lists/tuples/dicts keep their shape."""
        if isinstance(v, ms.Tensor):
            return self.tensor_record(v, file_stem, save, waits)
        if v is None:
            return None
        if isinstance(v, _SCALARS):
            return scalar_record(v)
        if isinstance(v, (list, tuple)):
            return [self.value_record(x, f"{file_stem}.{i}", save, waits) for i, x in enumerate(v)]
        if isinstance(v, dict):
            return {str(k): self.value_record(x, f"{file_stem}.{k}", save, waits) for k, x in v.items()}
        if isinstance(v, ms.nn.Cell):
            return None  # the `self` of a jit-compiled Cell method (Jit.SGD's first argument)
        return other_value_record(v)

    # -- calls -----------------------------------------------------------------------------------
    def parent_key(self):
        return self.module_stack[-1] if self.module_stack else None

    def record_call(self, prefix, name, func, args, kwargs, inplace=False):
        """Run `func(*args, **kwargs)` and record it as API `{prefix}.{name}.{n}`. Returns its result."""
        if self.stuck:
            self.release_stuck(-1)  # a forward call: the backward pass is over
        if self._after_backward:
            self.resolve_late()
        index = self.counter.next(f"{prefix}.{name}")
        key = naming.api_key(prefix, name, index, naming.FORWARD)
        flt = self.filter
        if not flt.want_call(key, self.module_stack) or self.overflow_done:
            return func(*args, **kwargs)
        save = self.saves_tensor(key)
        waits = []
        tracker = None
        _state.busy = True
        try:
            stack = capture_stack() if self.with_stack else None
            if flt.forward and flt.input:
                in_args, in_kwargs = self.args_records(key, args, kwargs, "input", save, waits)
            else:
                in_args, in_kwargs = [], {}
            if inplace:
                self.resolve_late()  # queued records must see the values before this call changes them
                changed = _tensors_in(args)
                self.summarizer.forget(changed)
                self.params_changed(changed)
            if flt.backward and grad_recording():
                self._seq += 1
                tracker = GradTracker(self, naming.api_key(prefix, name, index, naming.BACKWARD), save,
                                      _backward_parent(self.module_stack), self._seq)
                self.trackers[tracker] = None  # creation order: the order partial records go out in
                # in place: the call must change the caller's tensor, not a hook copy of it
                args = tracker.hook_inputs(args, in_place=inplace)
        finally:
            _state.busy = False
        _state.depth += 1
        try:
            out = func(*args, **kwargs)
        finally:
            _state.depth -= 1
        _state.busy = True
        try:
            result = out
            if inplace and args and not isinstance(out, ms.Tensor):
                result = args[0]  # __setitem__, collectives: the changed argument is the result
            if flt.forward:
                outs = self._outputs_checked(key, result, save, waits)
                record = {"input_args": in_args, "input_kwargs": in_kwargs, "output": outs if flt.output else []}
                self.emit(key, record, waits, check=outs)
            self.note_structure(key, self.parent_key(), stack)
            if tracker is not None and inplace:
                self._track(tracker, result)  # tensor hooks: the caller keeps its own result
            elif tracker is not None:
                out = self._track(tracker, out, tensor_hooks=self.synchronous)
        finally:
            _state.busy = False
        return out

    def _outputs_checked(self, key, out, save, waits):
        """Output records when data_mode has them; overflow_check summarises them anyway (no files) to
        decide on the record."""
        if self.filter.output:
            return self.outputs_record(key, out, save, waits)
        return self.outputs_record(key, out, False, waits) if self.gate is not None else []

    def _track(self, tracker, out, tensor_hooks=False):
        new = tracker.hook_outputs(out, tensor_hooks)
        if not tracker.outs_left:  # nothing differentiable came out: no backward record
            tracker.session = None
            self.trackers.pop(tracker, None)
        return new

    def begin_cell(self, key, args, kwargs, track=True):
        """Cell pre-hook: input statistics now; returns the frame for end_cell and the (hooked) args."""
        if self.stuck:
            self.release_stuck(-1)
        if self._after_backward:
            self.resolve_late()
        flt = self.filter
        save = self.saves_tensor(key)
        waits = []
        stack = capture_stack() if self.with_stack else None
        done = self.overflow_done
        in_args, in_kwargs = (self.args_records(key, args, kwargs, "input", save, waits)
                              if flt.forward and flt.input and not done else ([], {}))
        tracker = None
        if track and flt.backward and grad_recording() and not done:
            self._seq += 1
            tracker = GradTracker(self, key.replace(".forward.", ".backward."), save,
                                  _backward_parent(self.module_stack[:-1]), self._seq)
            self.trackers[tracker] = None
            args = tracker.hook_inputs(args)
        return (save, waits, stack, in_args, in_kwargs, tracker), args

    def end_cell(self, key, parent, cell, frame, output):
        """Cell post-hook: the forward record; returns the (hooked) output."""
        save, waits, stack, in_args, in_kwargs, tracker = frame
        flt = self.filter
        self.recorded_cells.add(key.rsplit(".", 2)[0])
        if flt.forward and not self.overflow_done:
            params = {n: self.tensor_record(p, f"{key}.parameters.{n}", save, waits)
                      for n, p in cell.parameters_and_names(expand=False)}
            outs = self._outputs_checked(key, output, save, waits)
            record = {"input_args": in_args, "input_kwargs": in_kwargs, "output": outs if flt.output else [],
                      "parameters": params}
            self.emit(key, record, waits, check=outs)
        self.note_structure(key, parent, stack)
        if tracker is not None and output is not None:
            return self._track(tracker, output)
        return output

    def emit_params_grad(self, base, grads):
        if not self.filter.backward or self.overflow_done:
            return
        prefix, rest = base.split(".", 1)
        path, cls = rest.rsplit(".", 1)
        key = naming.params_grad_key(prefix, path, cls, self.counter.next(base + ".parameters_grad"))
        save = self.saves_tensor(key)
        waits = []
        record = {n: [self.gradient_record(g, f"{key}.{n}", save, waits) if g is not None else None]
                  for n, g in grads.items()}
        self.emit(key, record, waits)

    def release_stuck(self, seq, keep_in_place=False):
        """Emit the stuck trackers created after call number `seq`, latest first (backward order);
        `keep_in_place`: not those of in-place calls."""
        ready = sorted((t for t in self.stuck if t.seq > seq and not (keep_in_place and t.in_place)),
                       key=lambda t: -t.seq)
        for t in ready:
            self.stuck.pop(t, None)
            t.emit_partial()

    def emit_backward(self, tracker):
        """Called by a GradTracker when the gradients of a call are complete."""
        self.trackers.pop(tracker, None)
        self.stuck.pop(tracker, None)
        flt = self.filter
        record = {"input": tracker.out_recs if flt.input else [],
                  "output": tracker.in_recs if flt.output else []}
        # overflow_check: a backward record is kept when the gradients it computed (its "output") overflow
        self.emit(tracker.key, record, tracker.waits, check=tracker.in_recs)
        if self.cfg.extra_info and self.cfg.level in ("mix", "L0"):
            if self.gate is not None:
                self.gate.on_keep(tracker.key, lambda: self._writer().add_construct(tracker.key, tracker.parent))
            else:
                self._writer().add_construct(tracker.key, tracker.parent)

    # -- step end --------------------------------------------------------------------------------
    def flush(self):
        """Emit partial backward records (latest call first, as backward runs), write stack.json."""
        for tracker in reversed(list(self.trackers)):
            tracker.emit_partial()
        self.trackers.clear()
        for handle in self.tensor_hooks:
            handle.remove()
        self.tensor_hooks = []
        self.resolve_late()
        self.settle_overflow()
        if self.writer is not None:
            self.writer.flush()

    def close(self):
        prev, _state.busy = _state.busy, True
        try:
            self.flush()
        finally:
            _state.busy = prev
        self._close_writer()
        self.summarizer.clear()
        if self.graph is not None:
            self.graph.close()


# Tensors waiting for their statistics before they are summarised at once (bounds the memory they hold).
LATE_LIMIT = 512
_LATE_LOCK = threading.Lock()


class LateFuture:
    """The part of concurrent.futures.Future the writer and OverflowGate use, for one deferred record:
    hundreds are made per step, and a Future builds a Condition (two locks) each time. Completed on the
    training thread, or on a writer thread when the record also waits for a tensor file."""

    __slots__ = ("_done", "_exc", "_callbacks")

    def __init__(self):
        self._done = False
        self._exc = None
        self._callbacks = []

    def done(self):
        return self._done

    def exception(self):
        return self._exc

    def add_done_callback(self, fn):
        with _LATE_LOCK:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def set_result(self, _result):
        self._finish(None)

    def set_exception(self, exc):
        self._finish(exc)

    def _finish(self, exc):
        with _LATE_LOCK:
            self._exc, self._done = exc, True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)


def _all_done(futures):
    """A future that completes when all of `futures` have (with the first exception, if any)."""
    done = Future()
    left = [len(futures)]

    def one(f):
        left[0] -= 1
        if left[0] == 0:
            errors = [x.exception() for x in futures if x.exception() is not None]
            if errors:
                done.set_exception(errors[0])
            else:
                done.set_result(None)
    for f in futures:
        f.add_done_callback(one)
    return done


def _copy_outcome(src, dst):
    if src.exception() is not None:
        dst.set_exception(src.exception())
    else:
        dst.set_result(None)


def _tensors_in(values):
    out = []
    for v in values:
        if isinstance(v, ms.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_tensors_in(v))
    return out


def _backward_parent(stack):
    return stack[-1].replace(".forward.", ".backward.") if stack else None


def other_value_record(v):
    """Record for a non-tensor, non-container argument (dtype, slice, ellipsis ...)."""
    if isinstance(v, ms.dtype.Type):
        return {"type": "mindspore.dtype", "value": str(v)}
    return common_value_record(v)


def current_rank():
    """The communication rank when mindspore.communication is initialised, else None (-> proc{pid})."""
    try:
        from mindspore.communication.management import GlobalComm, get_rank
    except ImportError:
        return None
    if GlobalComm.INITED:
        return get_rank()
    return None

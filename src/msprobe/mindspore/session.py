"""DumpSession: MindSpore's side of one step's capture — calls, Cell hooks and gradients into records.

The capture layers (wrapped APIs, Cell hooks, GradTracker, debug save) call into the session; the flow
after a record is made (queue, batch resolve, overflow gate, writer) is core/dump/capture.py. Reading
a MindSpore tensor makes the PyNative pipeline wait for it, so statistics are read in batches: a
record's tensors wait in `_late` (a Deferral, core/dump/deferral.py) until a resolve (after a backward
pass, before an in-place call, every LATE_LIMIT tensors, at stop() and at the step's end). Hot path:
`record_call`.
"""

import weakref

import mindspore as ms
import numpy as np

from msprobe.core import naming
from msprobe.core.dump.call_capture import CallCapture
from msprobe.core.dump.capture import CaptureSession
from msprobe.core.dump.deferral import Deferral
from msprobe.core.dump.json_append import scalar_record
from msprobe.core.dump.overflow import BFLOAT16_MAX, FLOAT16_MAX
from msprobe.core.dump.records import common_value_record
from msprobe.core.dump.tensor_files import save_npy
from msprobe.mindspore import _state, context_params
from msprobe.mindspore.capture.backward import GradTracker, grad_recording, remove_hook
from msprobe.mindspore.capture.grad_nodes import NodeGraph
from msprobe.mindspore.statistics import Summarizer, host_array
from msprobe.mindspore.tool_work import tool_work

_SCALARS = (int, float, bool, str)
# tensors waiting for their statistics before a resolve summarises them at once (bounds the memory held)
LATE_LIMIT = 512


class MindSporeCallOps:
    """MindSpore's operations in CallCapture's per-call flow (see core/dump/call_capture.py); `s` is
    the DumpSession."""

    __slots__ = ()
    work = tool_work

    @staticmethod
    def before_call(s):
        """A forward call: the backward pass is over (held and stuck trackers go out), the gradients
        it queued are summarised, and the Parameters' statistics read before it are dropped (see
        gradients_arrived)."""
        s.emit_held()
        if s.stuck:
            s.release_stuck(-1)
        if s._after_backward:
            s.resolve()
        if s._params_stale:
            s.params_changed()

    @staticmethod
    def run(func, args, kwargs):
        _state.depth += 1
        try:
            return func(*args, **kwargs)
        finally:
            _state.depth -= 1

    @staticmethod
    def before_mutation(s, args, kwargs):
        changed = _tensors_in(args)
        if s.gate is not None:  # overflow_check: the kept records' files are written before the change
            s.resolve()
        else:
            s.before_mutation(changed)  # queued records must see the values before this call changes them
        s.summarizer.forget(changed)
        s.params_changed(changed)

    @staticmethod
    def result_of(s, out, args, inplace):
        if inplace and args and not isinstance(out, ms.Tensor):
            return args[0]  # __setitem__, collectives: the changed argument is the result
        return out

    @staticmethod
    def backward_begin(s, key, parent, args, kwargs, save, inplace, module):
        """A GradTracker whose hooks the inputs pass through (an in-place call's first argument keeps
        its identity: the call must change the caller's tensor, not a hook copy of it)."""
        if not grad_recording():
            return None, args
        s._seq += 1
        tracker = GradTracker(s, key, save, parent, s._seq)
        s.trackers[tracker] = None  # creation order: the order partial records go out in
        return tracker, tracker.hook_inputs(args, in_place=inplace,
                                            graph=s.nodes if s.synchronous else None)

    @staticmethod
    def backward_end(s, tracker, key, parent, out, result, save, inplace, module):
        if module:  # a Cell's outputs: see GradTracker.hook_outputs
            if out is None:
                return out
            out = s._track(tracker, out, tensor_hooks=s.synchronous, cell=True)
            if tracker.top is not None:  # its first call's, when the Parameters' gradients come
                s.cell_tops.setdefault(key.rsplit(".", 2)[0], tracker.top)
            return out
        if inplace:
            s._track(tracker, result)  # tensor hooks: the caller keeps its own result
            return out
        return s._track(tracker, out, tensor_hooks=s.synchronous)

    @staticmethod
    def param_record(s, p, stem, save, waits):
        return s.tensor_record(p, stem, save, waits)

    @staticmethod
    def amend_outputs(s, outs):
        pass


CALLS = CallCapture(MindSporeCallOps())


class DumpSession(CaptureSession):
    """Recording state for one step of one rank (see CaptureSession for the arguments)."""

    framework = "mindspore"
    saturating = {"Float16": FLOAT16_MAX, "BFloat16": BFLOAT16_MAX}

    def __init__(self, cfg, step, rank, pool=None, dump_path=None, overflow=None):
        # (tensor, record, file stem, save, waits): summarised in one batch at a resolve
        self._late = Deferral(self._summarise_late, LATE_LIMIT + 1)
        self._on_cpu = context_params.device_target() == "CPU"
        super().__init__(cfg, step, rank, pool=pool, overflow=overflow, dump_path=dump_path)
        self.calls = CALLS
        self.graph = None  # the graph/ session when jit-compiled Cells are recorded (L0/mix)
        self.stuck = {}  # trackers with every output gradient in and some input gradient missing
        self.held = []  # complete trackers hooked by node whose records wait (see emit_backward)
        self.event_seq = None  # the number of the node whose run the running hook comes with
        # Cell -> the highest output node number of its first call hooked by node since its Parameters'
        # gradients last came (see params_grad_arriving)
        self.cell_tops = {}
        self._seq = 0
        # defer every tensor's statistics (not only gradients) until a resolve; off for level debug,
        # whose records go out one by one
        self.defer = cfg.level != "debug"
        self._after_backward = False  # gradients were queued: the next forward call resolves the batch
        # the model's trainable Parameters (set by the debugger): their statistics are read together
        self._model_params = ()
        # the read is dropped when a gradient arrives: L0/mix see every Parameter gradient through their
        # hooks, L1 only through the backward records of recorded calls
        self._params_tracked = cfg.level in ("L0", "mix") or (self.filter.backward and self.filter.passes_everything)
        self._param_recs = None  # id(p) -> (weakref to p, record), or None: not read since the last change
        self._params_stale = False  # gradients arrived: _param_recs go at the next forward call
        self.tensor_hooks = []  # hooks on tensors the caller keeps (capture/backward.py), removed at step end
        self._hooked = {}  # id -> weak reference of each tensor a hook of this step is on (see was_hooked)
        self._cells_hooked = cfg.level in ("L0", "mix")  # Cell outputs may be hooked themselves: note hooks
        # ops run synchronously while capturing (set at each start): tensor hooks are then the cheap
        # way to see gradients; in the asynchronous pipeline each one waits (capture/backward.py)
        self.synchronous = False
        # the step's autograd nodes as far as calls hooked by node saw them
        self.nodes = NodeGraph(param_inputs=cfg.level not in ("L0", "mix"))

    @property
    def model_params(self):
        return self._model_params

    @model_params.setter
    def model_params(self, params):
        self._model_params = params
        self.nodes.add_params(params)

    def idle_readable(self):
        """The flusher may summarise the waiting tensors: CPU tensors read with no MindSpore op
        (Summarizer.reads_without_op), so nothing it does is captured or races the training thread's
        ops. A device's are read where their ops run."""
        if self.held:  # backward records still to be queued: the backward pass is not idle
            return False
        reads = self.summarizer.reads_without_op
        return self._on_cpu and all(reads(t, save) for t, _, _, save, _ in self._late.items())

    def _new_summarizer(self):
        # the Deferral holds _summarise_late weakly: the summarizer must not hold its session in a cycle
        return Summarizer(stats=self.cfg.wants_stats, md5=self.cfg.summary_mode == "md5", late=self._late)

    def renumber(self, step):
        """The session's step number, changed before anything was written (MsprobeInitStep after start)."""
        self.step = step
        self.renumber_writer()
        if self.graph is not None:
            self.graph.renumber(step)

    def saves_tensor(self, key):
        """Tensor files for `key`? overflow_check: always, written only if the record is kept."""
        return self.gate is not None or self.filter.saves_tensor(key)

    @property
    def overflow_done(self):
        """overflow_check with overflow_nums reached: nothing more is recorded."""
        return self.gate is not None and self.gate.exhausted

    def save_tensor_file(self, value, path):
        arr = value if isinstance(value, np.ndarray) else host_array(value)
        return self._writer().submit(lambda: save_npy(path, arr), arr.nbytes)

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

    def gradients_arrived(self):
        """The optimizer may change the Parameters from now on: their statistics go at the next forward
        call (before_call), which comes before any later read of them, but are still the values the
        wrapped optimizer's step starts from (before_optimizer): the Parameters are not read twice."""
        if self._param_recs:
            self._params_stale = True

    def before_optimizer(self):
        """nn.Optimizer's step starts (optimizer_step.py): stuck trackers go out. Not a forward call:
        the gradients queued join the batch of the step's own inputs, one read for a gradient both
        show (see _summarise_late), and the Parameters' statistics stand until it changes them."""
        self.emit_held()
        if self.stuck:
            self.release_stuck(-1)

    def params_changed(self, tensors=None):
        """The Parameters changed (`tensors`: only these): drop their statistics read by param_record,
        here and in the summarizer's cache."""
        recs = self._param_recs
        if not recs:
            self._params_stale = False
            return
        if tensors is None:
            self._param_recs = None
            self._params_stale = False
            self.summarizer.forget([ref() for ref, _ in recs.values()])
            return
        for t in tensors:
            recs.pop(id(t), None)

    def tensor_record_now(self, t, file_stem, save, waits, into=None, same=None):
        """Record of tensor `t` now (filling in `into` when given; `same`: see Summarizer.summarize)."""
        rec, arr = self.summarizer.summarize(t, into, same)
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
        """Record of a tensor summarised at the next resolve (the next forward call after a backward
        pass, before an in-place call, at stop() and the step end, or when LATE_LIMIT are waiting).
        Reading a tensor — even its dtype — makes MindSpore's PyNative pipeline spin until the op that
        makes it has run, and doing that per call, inside the backward pass too, serialises the step. The
        record's tensor files, if any, join `waits` when it is summarised."""
        rec = {}
        if self._late.add((t, rec, file_stem, save, waits)):  # more than LATE_LIMIT wait
            self.resolve()
        return rec

    def gradient_record(self, g, file_stem, save, waits):
        """deferred_record for a gradient: the batch is resolved at the next forward call."""
        self._after_backward = True
        if self._param_recs:
            self.gradients_arrived()
        return self.deferred_record(g, file_stem, save, waits)

    def _summarise_late(self, late):
        """The summarizer's resolve: statistics (and files) of the tensors deferred_record queued.
        Tensors of the batch that are other objects over the same memory (a gradient seen by two
        hooks, an output handed on under another name) are read once: the batch is read at one
        moment, with all of them alive."""
        self._after_backward = False
        same = {}  # see Summarizer.summarize
        for t, rec, stem, save, waits in late:
            try:
                self.tensor_record_now(t, stem, save, waits, into=rec, same=same)
            except Exception as e:  # noqa: BLE001 - one bad tensor: logged, its record written without it
                self._writer().log_error(f"{stem or rec.get('type', 'a tensor')}: {e!r}")
        self.summarizer.drop_aliases()

    def resolve(self):
        prev, _state.busy = _state.busy, True  # reading tensors must not be recorded
        try:
            super().resolve()
        finally:
            _state.busy = prev

    def value_record(self, v, file_stem, save, waits):
        """Record of any argument/output value; nested lists/tuples/dicts keep their shape."""
        if isinstance(v, ms.Tensor):
            if self.defer and not isinstance(v, ms.Parameter):  # (tensor_record's first case, a call fewer)
                return self.deferred_record(v, file_stem, save, waits)
            return self.tensor_record(v, file_stem, save, waits)
        if v is None:
            return None
        if isinstance(v, _SCALARS):
            return scalar_record(v)
        if isinstance(v, (list, tuple)):
            if not save:
                return [self.value_record(x, None, False, waits) for x in v]
            return [self.value_record(x, f"{file_stem}.{i}", save, waits) for i, x in enumerate(v)]
        if isinstance(v, dict):
            return {str(k): self.value_record(x, f"{file_stem}.{k}" if save else None, save, waits)
                    for k, x in v.items()}
        if isinstance(v, ms.nn.Cell):
            return None  # the `self` of a jit-compiled Cell method (Jit.SGD's first argument)
        return other_value_record(v)

    # -- calls -----------------------------------------------------------------------------------
    def parent_key(self):
        return self.module_stack[-1] if self.module_stack else None

    def record_call(self, prefix, name, func, args, kwargs, inplace=False):
        """Run `func(*args, **kwargs)` and record it as API `{prefix}.{name}.{n}` (CallCapture.call).
        Returns its result."""
        return self.calls.call(self, prefix, name, func, args, kwargs, inplace)

    def hooked(self, t):
        """A hook of this step's backward records is on tensor `t` (see GradTracker.hook_outputs)."""
        if self._cells_hooked:
            self._hooked[id(t)] = weakref.ref(t)

    def was_hooked(self, t):
        ref = self._hooked.get(id(t))
        return ref is not None and ref() is t

    def _track(self, tracker, out, tensor_hooks=False, cell=False):
        new = tracker.hook_outputs(out, tensor_hooks, cell)
        if not tracker.outs_left:  # nothing differentiable came out: no backward record
            tracker.session = None
            self.trackers.pop(tracker, None)
        return new

    def begin_cell(self, key, parent, args, kwargs, track=True):
        """Cell pre-hook: input records now; returns the frame for end_cell and the (hooked) args.
        `track`: hook its backward."""
        self.calls.ops.before_call(self)
        return self.calls.begin(self, key, parent, args, kwargs, backward=track)

    def end_cell(self, frame, cell, output):
        """Cell post-hook: the forward record; returns the (hooked) output."""
        return self.calls.end(self, frame, output, params=cell.parameters_and_names(expand=False))

    def emit_params_grad(self, base, grads):
        if not self.filter.backward or self.overflow_done:
            return
        counted, stem = naming.params_grad_names(base)
        key = f"{stem}{self.counter.next(counted)}"
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

    def emit_backward(self, tracker, now=False):
        """Called by a GradTracker when the gradients of a call are complete (`now`: a partial record,
        at a release). One with inputs hooked by node goes out where it would have with stand-ins for
        them (see emit_held)."""
        seq = self.event_seq
        if not now and tracker.in_keys and seq is not None and seq > tracker.vseq:
            self.held.append(tracker)
            return
        self._emit_backward(tracker)

    def emit_held(self, seq=None):
        """A hook runs with node number `seq` (None: not known, or not a hook). MindSpore runs the
        ready node numbered highest first, and a call's stand-ins would be numbered just above its
        `vseq`: the held records of calls with `vseq` >= seq go out first, highest first (where a
        stand-in's hook would have sent them: after the nodes the call made had passed the gradient
        on, Parameters' included)."""
        self.event_seq = seq
        held = self.held
        if not held:
            return
        if seq is None:
            go, self.held = held, []
        else:
            go = [t for t in held if t.vseq >= seq]
            if not go:
                return
            self.held = [t for t in held if t.vseq < seq]
        go.sort(key=lambda t: (-t.vseq, -t.seq))  # stand-ins are numbered in the order calls begin
        for tracker in go:
            self._emit_backward(tracker)

    def params_grad_arriving(self, base):
        """A Parameter of Cell `base` gets its gradient: MindSpore ran the Cell's node that takes it
        just now, so the held records a stand-in's hook would have seen before that node go first."""
        seq = self.cell_tops.pop(base, None)
        if seq is not None:
            self.emit_held(seq)

    def _emit_backward(self, tracker):
        self.trackers.pop(tracker, None)
        self.stuck.pop(tracker, None)
        flt = self.filter
        record = {"input": tracker.out_recs if flt.input else [],
                  "output": tracker.in_recs if flt.output else []}
        # overflow_check: a backward record is kept when the gradients it computed (its "output") overflow
        self.emit(tracker.key, record, tracker.waits, check=tracker.in_recs)
        self.note_backward(tracker.key, tracker.parent)
        # MindSpore's grad graph keeps the tracker's hooks, and so the tracker, until the next step: its
        # records go with the queue's, not a step later (fewer objects for the collector to walk, too)
        tracker.out_recs = tracker.in_recs = tracker.waits = tracker.in_keys = tracker.parts = None

    # -- step end --------------------------------------------------------------------------------
    def emit_partial_backward(self):
        """Held records first, then the partial ones, latest call first, as backward runs."""
        self.emit_held()
        for tracker in reversed(list(self.trackers)):
            tracker.emit_partial()
        self.trackers.clear()

    def flush(self):
        prev, _state.busy = _state.busy, True
        try:
            for hook in self.tensor_hooks:
                remove_hook(hook)
            self.tensor_hooks = []
            self._hooked = {}
            super().flush()
        finally:
            _state.busy = prev

    def close(self):
        try:
            super().close()
        finally:
            if self.graph is not None:
                self.graph.close()


def _tensors_in(values):
    out = []
    for v in values:
        if isinstance(v, ms.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_tensors_in(v))
    return out


def _backward_parent(stack):
    return naming.backward_of(stack[-1]) if stack else None


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

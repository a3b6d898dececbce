"""The run-time side of records made inside compiled graphs: each `msprobe::record` event (capture/compiled.py)
turned into the records the eager path makes, through the same per-call flow (core/dump/call_capture.py).

A call event rebuilds the call's arguments and outputs from its site (capture/compiled_sites.py) around
the tensors and numbers the op received, names the call with the session's counters, asks the filters and
hands the call to CallCapture's `begin` and `end` with its outputs already computed; module begin/end
events do so as the eager module hooks do. `CompiledCallOps` is what differs from eager: the stack and
each tensor's requires_grad come from the site (inside a graph no tensor requires a gradient), and a
forward that will have a backward record waits (per call site) for its gradient events, paired with the
latest forward of the same site whose backward has not begun.

Records inside compiled graphs are summarised at once (Inductor reuses a buffer as soon as the op
returns) and never from the summary cache (Inductor writes buffers without bumping their version).
"""

from msprobe.core import naming
from msprobe.core.dump.call_capture import CallCapture
from msprobe.pytorch.capture.compiled_aten import emit_aten_records
from msprobe.pytorch.capture.compiled_sites import mark_outputs, mark_requires_grad, outputs_of, rebuild
from msprobe.pytorch.tool_work import tool_work

# what an event of the record op is (its first int)
CALL, OUT_GRAD, IN_GRAD, BEGIN, END = range(5)


class CompiledBackward:
    """The backward record of one compiled call, filled by its gradient events; what
    `DumpSession.emit_backward` reads (as from a BackwardTracker). `key` None: a call not recorded, whose
    events are only counted so that pairing stays in step."""

    __slots__ = ("session", "key", "parent", "save", "out_recs", "in_recs", "waits", "missing_in", "missing_out",
                 "by_inputs")

    def __init__(self, session, key, parent, save, n_out, n_in, grad_in, grad_out):
        self.session, self.key, self.parent, self.save = session, key, parent, save
        self.out_recs = [None] * n_out
        self.in_recs = [None] * n_in
        self.waits = []
        self.missing_in, self.missing_out = set(grad_in), set(grad_out)
        self.by_inputs = bool(grad_in)  # complete when the inputs' gradients came (they follow the outputs')

    def has(self, kind, pos):
        """Whether this event already came (then it belongs to another run of the same site)."""
        return pos not in (self.missing_in if kind == IN_GRAD else self.missing_out)

    def arrive(self, kind, pos, grad):
        """Record one gradient; True when the record is complete."""
        if kind == IN_GRAD:
            self.missing_in.discard(pos)
            role, recs = "output", self.in_recs
        else:
            self.missing_out.discard(pos)
            role, recs = "input", self.out_recs
        if self.key is not None and grad is not None and pos < len(recs):
            recs[pos] = self.session.tensor_record(grad, f"{self.key}.{role}.{pos}", self.save, self.waits,
                                                   defer=False)
        return not (self.missing_in if self.by_inputs else self.missing_out)

    def emit(self):
        session, self.session = self.session, None
        if session is not None and self.key is not None:
            session.emit_backward(self)

    def emit_partial(self):
        """At step end: emit what arrived if an output's gradient did (as a BackwardTracker does)."""
        if any(r is not None for r in self.out_recs):
            self.emit()
        self.session = None


class CompiledCallOps:
    """CallCapture's operations (core/dump/call_capture.py) for a call a compiled graph already ran.
    What the end of the call being recorded carries: `site`, the site of its inputs (an API call's, a
    module's pre-hook's); `outputs`, `grad_out`, `n_out`: its output layout, hooked output positions and
    number of output tensors."""

    __slots__ = ("site", "outputs", "grad_out", "n_out")
    work = tool_work

    def __init__(self):
        self.site, self.outputs, self.grad_out, self.n_out = None, None, (), 0

    @staticmethod
    def before_call(s):
        pass

    @staticmethod
    def run(func, args, kwargs):
        return func(*args, **kwargs)

    @staticmethod
    def before_mutation(s, args, kwargs):
        pass  # nothing waits: records inside a graph are summarised at once

    @staticmethod
    def result_of(s, out, args, inplace):
        return out  # rebuilt from the site: an in-place call's outputs are its changed arguments already

    @staticmethod
    def backward_begin(s, key, parent, args, kwargs, save, inplace, module):
        return True, args  # the gradient events come from the graph's own hooks (capture/compiled.py)

    def backward_end(self, s, state, key, parent, out, result, save, inplace, module):
        if self.grad_out:
            s.compiled_calls.wait(self.site, self.grad_out, key, parent, save and s.gate is None, self.n_out)
        return out

    @staticmethod
    def param_record(s, p, stem, save, waits):
        # parameters change in place only in the optimizer, which launches what waits (debugger)
        return s.tensor_record(p, stem, save, waits, defer=True)

    def amend_outputs(self, s, outs):
        mark_outputs(self.outputs, outs)  # requires_grad as the eager tensors have it


class CompiledCalls:
    """One session's records from compiled graphs: module frames and backward pairing."""

    def __init__(self, session):
        self.session = session
        self.ops = CompiledCallOps()
        self.calls = CallCapture(self.ops)
        self.frames = []  # (key, CallFrame or None, begin site) of the modules running now
        self.waiting = {}  # site pair -> CompiledBackward of forwards whose backward has not begun
        self.running = {}  # site pair -> the CompiledBackward its events fill now

    def on(self, kind, tensors, ints, floats, site, outputs):
        session = self.session
        session.summarizer.forget(tensors)  # a reused buffer keeps its version: nothing cached is valid
        summarizer = session.summarizer
        prev, summarizer.defer_forward = summarizer.defer_forward, False
        shared, summarizer.share_forward = summarizer.share_forward, False  # records here get requires_grad set
        try:
            if kind == CALL:
                self._call(site, outputs_of(outputs), tensors, ints, floats)
            elif kind == BEGIN:
                self._begin(site, tensors, ints, floats)
            elif kind == END:
                self._end(site, tensors, ints, floats)
            else:  # an input's hook carries its index among the op's tensors; no tensor: a gradient of None
                self._grad(kind, site, site.eager_position(ints[0]) if kind == IN_GRAD else ints[0],
                           tensors[0] if tensors else None)
        finally:
            summarizer.defer_forward = prev
            summarizer.share_forward = shared

    def _call(self, site, outputs, tensors, ints, floats):
        """An API call, as `CallCapture.call` records it (the call itself ran in the graph)."""
        s = self.session
        prefix, name = site.prefix, site.name
        key = naming.api_key(prefix, name, s.counter.next(f"{prefix}.{name}"), naming.FORWARD)
        out_desc, grad_out, aten = outputs
        if aten:  # level L2: the API names its aten ops' parent only
            emit_aten_records(s, site, key, tensors, ints, floats)
            return
        gate = s.gate
        frame = None
        if s.filter.want_call(key, s.module_stack) and not (gate is not None and gate.exhausted):
            args, kwargs = rebuild(site.args, tensors, ints, floats), rebuild(site.kwargs, tensors, ints, floats)
            frame, _ = self.calls.begin(s, key, s.parent_key(), args, kwargs, inplace=site.inplace, module=False,
                                        backward=bool(grad_out), stack=site.stack)
            mark_requires_grad(site.args, frame.in_args)
            mark_requires_grad(site.kwargs, frame.in_kwargs)
            self._end_event(site, out_desc, grad_out, len(tensors) - site.n_in)
            self.calls.end(s, frame, rebuild(out_desc, tensors[site.n_in:], ints, floats))
        self._unpaired(frame, site, grad_out)

    def _begin(self, site, tensors, ints, floats):
        """A module's pre-hook, as ModuleCapture's."""
        s = self.session
        key = f"{site.base}.forward.{s.counter.next(site.base)}"
        enclosing = s.module_stack
        parent = enclosing[-1] if enclosing else None
        want = s.filter.want_call(key, enclosing)
        s.module_stack.append(key)
        frame = None
        if want:
            args, kwargs = rebuild(site.args, tensors, ints, floats), rebuild(site.kwargs, tensors, ints, floats)
            frame = self.calls.begin(s, key, parent, args, kwargs, stack=site.stack)[0]
            mark_requires_grad(site.args, frame.in_args)
            mark_requires_grad(site.kwargs, frame.in_kwargs)
        self.frames.append((key, frame, site))

    def _end(self, site, tensors, ints, floats):
        """A module's post-hook, as ModuleCapture's."""
        if not self.frames:
            return
        key, frame, begin = self.frames.pop()
        s = self.session
        if s.module_stack and s.module_stack[-1] == key:
            s.module_stack.pop()
        if frame is not None:
            n_out = len(tensors) - len(site.params)
            self._end_event(begin, site.outputs, site.grad_out, n_out)
            self.calls.end(s, frame, rebuild(site.outputs, tensors[:n_out], ints, floats),
                           params=zip(site.params, tensors[n_out:]))
        self._unpaired(frame, begin, site.grad_out)

    def _end_event(self, site, outputs, grad_out, n_out):
        """What the ops read while the call's end is recorded (see CompiledCallOps)."""
        ops = self.ops
        ops.site, ops.outputs, ops.grad_out, ops.n_out = site, outputs, grad_out, n_out

    def _unpaired(self, frame, site, grad_out):
        """A call whose gradient events come but make no record (not recorded, or without backward): they
        are counted all the same, so that later events pair with their own forwards."""
        if grad_out and self.session.filter.backward and (frame is None or frame.backward is None):
            self.wait(site, grad_out, None, None, False, 0)

    def wait(self, site, grad_out, key, parent, save, n_out):
        """A forward whose backward record the gradient events will fill (`key` None: not recorded); `site`
        holds its inputs."""
        entry = CompiledBackward(self.session, key, parent, save, n_out, site.n_in, site.grad_in, grad_out)
        self.waiting.setdefault(site.pair, []).append(entry)

    def _grad(self, kind, site, pos, grad):
        pair = site.pair
        entry = self.running.get(pair)
        if entry is None or entry.has(kind, pos):
            if entry is not None:  # a gradient never came (an unused output): what did is its record
                self.session.trackers.pop(entry, None)
                entry.emit_partial()
            stack = self.waiting.get(pair)
            if not stack:
                self.running.pop(pair, None)
                return
            entry = self.running[pair] = stack.pop()
            if entry.key is not None:
                self.session.trackers[entry] = None  # step end emits it if it is still incomplete
        if entry.arrive(kind, pos, grad):
            del self.running[pair]
            if entry.key is not None:
                entry.emit()

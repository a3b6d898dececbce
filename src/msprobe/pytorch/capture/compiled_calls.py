"""The run-time side of records made inside compiled graphs: each `msprobe::record` event (capture/compiled.py)
turned into the records the eager path makes, with the session's own builders.

A call event rebuilds the call's arguments and outputs from its site (capture/compiled_sites.py) around
the tensors and numbers the op received, names the call with the session's counters, asks the filters
and emits the record; module begin/end events keep the module stack as the eager hooks do. Backward: a
forward that will have a backward record waits (per call site) for its gradient events, and one is
paired with the latest forward of the same site whose backward has not begun.

Records inside compiled graphs are summarised at once (Inductor reuses a buffer as soon as the op
returns) and never from the summary cache (Inductor writes buffers without bumping their version).
"""

from msprobe.core import naming
from msprobe.pytorch.capture.compiled_aten import emit_aten_records
from msprobe.pytorch.capture.compiled_sites import mark_outputs, mark_requires_grad, outputs_of, rebuild

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


class CompiledCalls:
    """One session's records from compiled graphs: module frames and backward pairing."""

    def __init__(self, session):
        self.session = session
        self.frames = []  # (key, parent, inputs half or None, begin site) of the modules running now
        self.waiting = {}  # site pair -> CompiledBackward of forwards whose backward has not begun
        self.running = {}  # site pair -> the CompiledBackward its events fill now

    def on(self, kind, tensors, ints, floats, site, outputs):
        session = self.session
        session.summarizer.forget(tensors)  # a reused buffer keeps its version: nothing cached is valid
        prev, session.defer_forward = session.defer_forward, False
        try:
            if kind == CALL:
                self._call(site, outputs_of(outputs), tensors, ints, floats)
            elif kind == BEGIN:
                self._begin(site, tensors, ints, floats)
            elif kind == END:
                self._end(site, tensors, ints, floats)
            else:  # an input's hook carries its index among the op's tensors
                self._grad(kind, site, site.eager_position(ints[0]) if kind == IN_GRAD else ints[0], tensors[0])
        finally:
            session.defer_forward = prev

    def _call(self, site, outputs, tensors, ints, floats):
        """An API call: its forward record, as `DumpSession.record_call` makes it."""
        s = self.session
        flt = s.filter
        prefix, name, inplace = site.prefix, site.name, site.inplace
        key = naming.api_key(prefix, name, s.counter.next(f"{prefix}.{name}"), naming.FORWARD)
        out_desc, grad_out, aten = outputs
        if aten:  # level L2: the API names its aten ops' parent only
            emit_aten_records(s, site, key, tensors, ints, floats)
            return
        backward = bool(grad_out) and flt.backward
        gate = s.gate
        if not flt.want_call(key, s.module_stack) or (gate is not None and gate.exhausted):
            if backward:
                self._wait(site, grad_out, None, None, False, 0)
            return
        save = flt.saves_tensor(key) or gate is not None
        listed_forward = flt.wants_forward(key, s.module_stack)
        n_out = len(tensors) - site.n_in
        if flt.forward and listed_forward:
            args, kwargs = rebuild(site.args, tensors, ints, floats), rebuild(site.kwargs, tensors, ints, floats)
            result = rebuild(out_desc, tensors[site.n_in:], ints, floats)
            waits = []
            in_args, in_kwargs = (s.args_records(key, args, kwargs, "input", save and not (inplace and gate is not None),
                                                 waits) if flt.input else ([], {}))
            outs = s.outputs_record(key, result, save, waits) if flt.output or gate is not None else []
            mark_requires_grad(site.args, in_args)
            mark_requires_grad(site.kwargs, in_kwargs)
            mark_outputs(out_desc, outs)
            record = {"input_args": in_args, "input_kwargs": in_kwargs, "output": outs if flt.output else []}
            s.emit(key, record, waits, check=outs)
        if listed_forward:
            s.note_structure(key, s.parent_key(), site.stack if s.with_stack else None)
        if backward:
            parent = naming.backward_of(s.module_stack[-1]) if s.module_stack else None
            self._wait(site, grad_out, naming.backward_of(key), parent, save and gate is None, n_out)

    def _begin(self, site, tensors, ints, floats):
        """A module's pre-hook, as ModuleCapture's."""
        s = self.session
        key = f"{site.base}.forward.{s.counter.next(site.base)}"
        enclosing = s.module_stack
        parent = enclosing[-1] if enclosing else None
        want = s.filter.want_call(key, enclosing)
        s.module_stack.append(key)
        inputs = None
        if want:
            args, kwargs = rebuild(site.args, tensors, ints, floats), rebuild(site.kwargs, tensors, ints, floats)
            inputs = s.module_inputs(key, args, kwargs, site.stack if s.with_stack else None)
            mark_requires_grad(site.args, inputs[3])
            mark_requires_grad(site.kwargs, inputs[4])
        self.frames.append((key, parent, inputs, site))

    def _end(self, site, tensors, ints, floats):
        if not self.frames:
            return
        key, parent, inputs, begin = self.frames.pop()
        s = self.session
        if s.module_stack and s.module_stack[-1] == key:
            s.module_stack.pop()
        backward = bool(site.grad_out) and s.filter.backward
        if inputs is None:
            if backward:
                self._wait(begin, site.grad_out, None, None, False, 0)
            return
        n_out = len(tensors) - len(site.params)
        output = rebuild(site.outputs, tensors[:n_out], ints, floats)
        mark_outputs(site.outputs, s.emit_module(key, parent, inputs, zip(site.params, tensors[n_out:]), output))
        if backward:
            self._wait(begin, site.grad_out, naming.backward_of(key), naming.backward_of(parent) if parent else None,
                       inputs[0] and s.gate is None, n_out)

    def _wait(self, site, grad_out, key, parent, save, n_out):
        """A forward whose backward record the gradient events will fill (`key` None: not recorded); `site`
        holds its inputs (an API call's, a module's begin site)."""
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

"""CallCapture: the per-call flow of a dump, written once for both frameworks.

    key -> filter / overflow gate -> save tensor files? -> stack -> input records -> before a mutation
      -> backward hooks on the inputs -> run -> output records -> emit -> structure -> backward tracking

An API call goes through `call` (begin, run, end); a module's (Cell's) pre-hook calls `begin` and its
post-hook `end`. What differs between frameworks is in the `ops` object the adapter composes in:

    ops.work()                          context manager around msprobe's own work (not recorded itself)
    ops.before_call(s)                  a forward call starts (MindSpore: resolve what backward queued);
                                        None: nothing to do
    ops.run(func, args, kwargs)         run the call; calls it makes itself are nested, not recorded
    ops.before_mutation(s, args, kwargs)  the call changes these in place: summaries waiting for them go first
    ops.result_of(s, out, args, inplace)  what an in-place call produced (its changed argument); asked
                                        for in-place calls only (inplace True)
    ops.backward_begin(s, key, parent, args, kwargs, save, inplace, module) -> (state, args)
                                        before it runs (`key`, `parent`: backward keys; state None: none)
    ops.backward_end(s, state, key, parent, out, result, save, inplace, module) -> out   hook its backward
    ops.param_record(s, p, stem, save, waits)   a module's parameter record
    ops.amend_outputs(s, outs)          the output records, before they go out (compiled graphs: the
                                        traced requires_grad); None: nothing to do

`s` is the session: neither CallCapture nor the ops hold it (a session holding its CallCapture would
otherwise be a reference cycle, freed only by the cyclic collector).

Records of values come from the session (`args_records` / `outputs_record`, core/dump/records.py,
over its `value_record`); the records go to the session's `emit` (with the call's parent and stack:
its construct.json and stack.json entries are made when the queue is written) or, for a call with
no record, `note_structure` (capture.py).
PyTorch's API calls and module hooks take twins of `call`, `begin` and `end` in C where the session's
filter takes every call and nothing is saved (msprobe._call, src/msprobe/_native/call.c; pytorch/session.py
`call_path`): a change to the flow here is made there too (tests/pytorch/test_native_call.py compares the
dumps of both).
Framework-free.
"""

from msprobe.core import naming
from msprobe.core.stack import capture_stack

_PARENT = object()  # `call`'s default parent (the session's parent_key()), `begin`'s default stack


class CallFrame:
    """A call between `begin` and `end`."""

    __slots__ = ("key", "parent", "save", "waits", "stack", "in_args", "in_kwargs", "forward", "listed",
                 "inplace", "module", "backward", "bkey", "bparent")


class CallCapture:
    """The per-call flow of a framework's sessions (`ops`: see the module doc); each method takes the
    session `s` (a CaptureSession) first."""

    __slots__ = ("ops",)

    def __init__(self, ops):
        self.ops = ops

    def call(self, s, prefix, name, func, args, kwargs, inplace=False, mutates=False, buffers=(),
             parent=_PARENT, backward=True):
        """Run `func(*args, **kwargs)` and record it as API `{prefix}.{name}.{n}`; returns its result.
        `mutates`: it changes an argument in place without being an in-place call (`out=`,
        `inplace=True`); `buffers`: positions and names of arguments it only writes into; `parent`:
        its parent in construct.json (default: the session's `parent_key()`); `backward`: track it."""
        ops = self.ops
        if ops.before_call is not None:
            ops.before_call(s)
        key = s.counter.next_api_key(prefix, name)
        gate = s.gate
        flt = s.filter
        if flt.passes_everything:  # no scope or list (want_call's answer, without its frame)
            flt.hit = True
        elif not flt.want_call(key, s.module_stack):
            return self._unrecorded(s, func, args, kwargs, inplace or mutates)
        if gate is not None and gate.exhausted:
            return self._unrecorded(s, func, args, kwargs, inplace or mutates)
        frame, args = self.begin(s, key, s.parent_key() if parent is _PARENT else parent, args, kwargs,
                                 inplace=inplace, mutates=mutates, buffers=buffers, module=False,
                                 backward=backward)
        out = ops.run(func, args, kwargs)
        return self.end(s, frame, out, args)

    def _unrecorded(self, s, func, args, kwargs, changes):
        """Run a call left out of the dump; one that changes its arguments lets what waits for them go
        first (summaries recorded earlier, still to be read)."""
        if changes:
            with self.ops.work():
                self.ops.before_mutation(s, args, kwargs)
        return func(*args, **kwargs)

    def begin(self, s, key, parent, args, kwargs, inplace=False, mutates=False, buffers=(), module=True,
              backward=True, stack=_PARENT):
        """Everything before call `key` runs (its filter passed). Returns (frame, args): the arguments
        to run it with (MindSpore passes them through its backward hooks). `stack`: its call stack when
        the caller knows it (a compiled graph's call site; one for many records made at one place),
        default: taken here."""
        ops = self.ops
        flt = s.filter
        gate = s.gate
        f = CallFrame()
        f.key, f.parent, f.inplace, f.module = key, parent, inplace, module
        # overflow_check: every record may be kept, with its files (an in-place call's inputs have none:
        # their memory is overwritten before the gate decides)
        f.save = save = (flt.saves_all_tensors or gate is not None
                         or (True if flt.tensor_list and flt.saves_tensor(key) else False))
        f.waits = waits = []
        exhausted = gate is not None and gate.exhausted
        # False: only its backward key is listed. A module's structure is noted anyway (its calls hang on it).
        listed = not flt.list or flt.wants_forward(key, s.module_stack)
        f.listed = listed or module
        f.forward = forward = flt.forward and listed and not exhausted
        with ops.work():
            f.stack = (capture_stack() if stack is _PARENT else stack) if s.with_stack else None
            if forward and flt.input:
                f.in_args, f.in_kwargs = s.args_records(key, args, kwargs, "input",
                                                        save and not (inplace and gate is not None), waits,
                                                        buffers)
            else:
                f.in_args, f.in_kwargs = [], {}
            if inplace or mutates:
                ops.before_mutation(s, args, kwargs)
            if backward and flt.backward and not exhausted:
                # the enclosing module's backward is the parent of this one's
                enclosing = parent if module else (s.module_stack[-1] if s.module_stack else None)
                f.bparent = naming.backward_of(enclosing) if enclosing else None
                f.bkey = naming.backward_of(key)  # built once: begin and end both hand it on
                f.backward, args = ops.backward_begin(s, f.bkey, f.bparent, args, kwargs, save, inplace, module)
            else:
                f.backward = None
        return f, args

    def end(self, s, f, out, args=(), params=None):
        """Everything after the call of frame `f` returned `out`; `params`: a module's own
        (name, parameter) pairs. Returns the output to hand on (MindSpore: through backward hooks)."""
        ops = self.ops
        flt = s.filter
        gate = s.gate
        key = f.key
        with ops.work():
            result = ops.result_of(s, out, args, True) if f.inplace else out
            listed = f.listed
            if f.forward and not (gate is not None and gate.exhausted):
                save, waits = f.save, f.waits
                record = {"input_args": f.in_args, "input_kwargs": f.in_kwargs}
                if params is not None:
                    params = {n: ops.param_record(s, p, f"{key}.parameters.{n}" if save else None, save, waits) for n, p in params}
                if flt.output:
                    outs = record["output"] = s.outputs_record(key, result, save, waits)
                elif gate is not None:  # summarised to decide on the record, without files
                    outs = s.outputs_record(key, result, False, waits)
                    record["output"] = []
                else:
                    outs = record["output"] = []
                if params is not None:
                    record["parameters"] = params
                if ops.amend_outputs is not None:
                    ops.amend_outputs(s, outs)
                # its construct.json and stack.json entries ride in the record's queue entry
                if listed:
                    s.emit(key, record, waits, outs, None, f.parent, f.stack)
                else:
                    s.emit(key, record, waits, outs)
                listed = False
            if f.module:
                s.recorded_modules.add(key.rsplit(".", 2)[0])  # its parameters' gradients are recorded
            if listed:
                s.note_structure(key, f.parent, f.stack)
            if f.backward is not None:
                out = ops.backward_end(s, f.backward, f.bkey, f.bparent, out, result, f.save, f.inplace, f.module)
        return out

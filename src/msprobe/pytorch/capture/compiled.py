"""Capture inside torch.compile: records made by an op the compiled graph keeps and runs, not by graph
breaks.

While Dynamo traces a dumped model, the L1 mode (capture/api_mode.py) and the L0 hooks
(capture/modules.py) take the paths here instead of recording: each recorded call puts one
`msprobe::record` op into the graph, a custom op registered with an ordered effect, so Dynamo keeps
it, AOTAutograd threads it in program order and Inductor neither drops nor reorders it. At run time
the op's body (`CompiledCalls`) makes the same records the eager path makes, through the session's
own record builders: the API or module name, arguments and outputs from the site the graph carries
(capture/compiled_sites.py), the counters, the module stack and the filters read live.

Backward: the inputs of a call that need a gradient are passed to it as aliases (`aten.alias`, free
in a compiled graph) with a tensor hook, and its outputs get a hook; Dynamo compiles the hooks into the
backward graph, where they run the same op with the gradient. A call's input hooks see exactly the
gradient that flows through that call, as the eager tracker's node hooks do. A backward event is
paired with the latest forward of the same call site whose backward has not begun (`waiting`).

Records inside compiled graphs are summarised at once (Inductor reuses a buffer as soon as the op
returns) and never from the summary cache (Inductor writes buffers without bumping their version).
Guarded by benchmarks/compile_overhead.py.
"""

import functools
import os
import sys

import torch
from torch.overrides import TorchFunctionMode

from msprobe.core import naming
from msprobe.pytorch import _state
from msprobe.pytorch.capture.compiled_aten import emit_aten_records
from msprobe.pytorch.capture.compiled_sites import (api_name, describe, mark_outputs, mark_requires_grad, outputs_of,
                                                    outputs_text, rebuild, site_of, site_text)
from msprobe.pytorch.tool_work import tool_work

# what an event of the record op is (its first int)
CALL, OUT_GRAD, IN_GRAD, BEGIN, END = range(5)

is_compiling = torch.compiler.is_compiling


@torch.library.custom_op("msprobe::record", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def record(tensors: list[torch.Tensor], ints: list[int], floats: list[float], site: str, outputs: str) -> None:
    """One event of a compiled call: `ints` is (event kind, then a gradient's position or the call's int
    arguments), `floats` its float arguments, `site` the call site's text, `outputs` an API call's outputs
    (`outputs_text`)."""
    session = _state.session
    if session is None or _state.busy:
        return
    calls = session.compiled_calls
    if calls is None:
        calls = session.compiled_calls = CompiledCalls(session)
    with tool_work():
        calls.on(ints[0], tensors, ints[1:], floats, site_of(site), outputs)


@record.register_fake
def _record_fake(tensors, ints, floats, site, outputs):
    return None


def _register_effect():
    from torch._library.effects import EffectType
    torch.library._register_effectful_op("msprobe::record", EffectType.ORDERED)


_register_effect()


# -- traced by Dynamo ------------------------------------------------------------------------------

def traced_api_call(func, args, kwargs, aten=False):
    """The L1 mode's handler while Dynamo traces: run `func`, put its record op (and its backward
    hooks) into the graph. `aten` (level L2): the record holds the aten ops eager would record
    (capture/compiled_aten.py) and the compiled backward is not hooked."""
    info = api_name(func)
    if info is None:
        return func(*args, **kwargs)
    prefix, name, inplace, flag = info
    inplace = inplace or "out" in kwargs  # no backward record, as in eager (api_mode.py, session.py)
    mutates = inplace or (flag is not None and (kwargs.get("inplace") is True
                                                 or (len(args) > flag and args[flag] is True)))
    ins, ints, floats = [], [], []
    a_desc = describe(args, ins, ints, floats)
    k_desc = describe(kwargs, ins, ints, floats)
    # the inputs as they are before the call (F.batch_norm updates its running statistics): copies that
    # the compiled graph drops wherever the call changes nothing
    seen = [_clone(t) for t in ins]
    backward = not inplace and not aten and torch.is_grad_enabled()
    hooked = _hooked_inputs(ins, alias=not mutates) if backward else []
    site = site_text("api", (prefix, name, inplace), func, a_desc, k_desc, None, tuple(p for p, _, _ in hooked),
                     (), len(ins))
    if hooked:
        _hook(site, (), (), hooked)  # before the call: a call that changes an input would move its hook
        args, kwargs = _swap(args, hooked), _swap(kwargs, hooked)
    out = func(*args, **kwargs)
    result = args[0] if inplace and len(args) > 0 and not isinstance(out, torch.Tensor) else out
    outs = []
    o_desc = describe(result, outs, ints, floats)
    grad_out = tuple(i for i, t in enumerate(outs) if t.requires_grad) if backward else ()
    torch.ops.msprobe.record(seen + outs, [CALL] + ints, floats, site, outputs_text(o_desc, grad_out, aten))
    _hook(site, outs, grad_out, ())
    return out


def traced_module_begin(base, module, args, kwargs):
    """A module's pre-hook while Dynamo traces: its begin event; returns (args, kwargs) with the inputs
    that need a gradient replaced by hooked aliases, or None."""
    ins, ints, floats = [], [], []
    a_desc = describe(args, ins, ints, floats)
    k_desc = describe(kwargs, ins, ints, floats)
    # torch.nn's in-place modules (ReLU(inplace=True), Dropout(inplace=True)) change their input: an alias
    # changed in place loses its hook, the input itself keeps it
    alias = getattr(module, "inplace", False) is not True
    hooked = _hooked_inputs(ins, alias) if torch.is_grad_enabled() else []
    site = site_text("begin", (base,), None, a_desc, k_desc, None, tuple(pos for pos, _, _ in hooked), (),
                     len(ins))
    torch.ops.msprobe.record(ins, [BEGIN] + ints, floats, site, "")
    if not hooked:
        return None
    _hook(site, (), (), hooked)
    return _swap(args, hooked), _swap(kwargs, hooked)


def traced_module_end(base, module, output):
    """A module's post-hook while Dynamo traces: its end event (outputs, then its own parameters)."""
    outs, ints, floats = [], [], []
    o_desc = describe(output, outs, ints, floats)
    params = [(n, p) for n, p in module._parameters.items() if p is not None]
    grad_out = tuple(i for i, t in enumerate(outs) if t.requires_grad) if torch.is_grad_enabled() else ()
    site = site_text("end", (base, tuple(n for n, _ in params)), None, None, None, o_desc, (), grad_out, 0)
    torch.ops.msprobe.record(outs + [p for _, p in params], [END] + ints, floats, site, "")
    _hook(site, outs, grad_out, ())


def _hooked_inputs(ins, alias):
    """(position, input, what is hooked) for each distinct input that needs a gradient, at its last position
    (as the eager tracker sums the edges of a tensor passed twice). With `alias` the call gets an alias of
    the input, whose hook sees only the gradient this call passes back; else the input itself is hooked."""
    out = []
    for pos, t in enumerate(ins):
        if not t.requires_grad:
            continue
        found = False
        for j in range(len(out)):
            if out[j][1] is t:
                out[j] = (pos, t, out[j][2])
                found = True
        if not found:
            out.append((pos, t, torch.ops.aten.alias.default(t) if alias else t))
    return out


def _clone(t):
    return torch.ops.aten.clone.default(t)  # an op, not an API: no mode records it (module hooks run under it)


def _swap(v, aliases):
    """`v` with each hooked input replaced by its alias (lists, tuples and dicts rebuilt)."""
    if isinstance(v, torch.Tensor):
        for _, t, a in aliases:
            if v is t:
                return a
        return v
    if isinstance(v, list):
        return [_swap(x, aliases) for x in v]
    if isinstance(v, tuple) and not isinstance(v, torch.Size):
        return tuple(_swap(x, aliases) for x in v)
    if isinstance(v, dict):
        return {k: _swap(x, aliases) for k, x in v.items()}
    return v


def _hook(site, outs, grad_out, aliases):
    for i in grad_out:
        outs[i].register_hook(functools.partial(_on_grad, site, OUT_GRAD, i))
    for pos, _, alias in aliases:
        alias.register_hook(functools.partial(_on_grad, site, IN_GRAD, pos))


def _on_grad(site, kind, pos, grad):
    torch.ops.msprobe.record([grad], [kind, pos], [], site, "")


# backends known to run the graph's PyTorch ops, msprobe::record among them
_BACKENDS_RUNNING_OPS = ("inductor", "aot_eager", "eager", "aot_eager_decomp_partition", "aot_inductor")


def compile_notes(models, level):
    """The one-line notes start() gives about dumping these compiled models (what cannot work, and what
    is captured instead)."""
    notes = []
    if level == "L2":
        notes.append("msprobe: level L2 on a compiled model: the aten ops each API dispatches are recorded with "
                     "statistics of the API's own inputs and outputs; tensors between them, fused away by the "
                     "compiler, are recorded without (fused_away); aten ops of the compiled backward and of code "
                     "run between graphs are not recorded")
    for name, config in _backends(models):
        if name not in _BACKENDS_RUNNING_OPS:
            notes.append(f"msprobe: torch.compile backend {name!r}: msprobe records through a custom op "
                         f"(msprobe::record) that {name!r} may not run; if a dumped step fails to compile, dump "
                         "with backend 'inductor' or 'aot_eager'")
        if (config or {}).get("triton.cudagraphs"):
            notes.append("msprobe: torch.compile mode 'reduce-overhead': graphs that hold msprobe's record op run "
                         "without CUDA graphs in dumped steps (the numbers are the same; the step is slower)")
    return notes


def _backends(models):
    """(backend name, options) of each torch.compile wrapper among the models (best effort: Dynamo's
    attributes, not an API)."""
    roots = [models] if isinstance(models, torch.nn.Module) else list(models or ())
    for root in roots:
        for m in root.modules():
            backend = getattr(getattr(getattr(getattr(m, "dynamo_ctx", None), "callback", None),
                                      "_torchdynamo_orig_backend", None), "_torchdynamo_orig_backend", None)
            if backend is not None:
                yield getattr(backend, "_compiler_name", None) or getattr(backend, "__name__", "?"), getattr(
                    backend, "config", None)


class RecordOrder:
    """Inductor's peak-memory reordering off while a dumped step compiles: it moves ordered effectful ops
    past each other (torch 2.13 ignores their ordering there), which would write records out of order.
    The schedule changes, not the numbers."""

    def __init__(self):
        self._saved = None

    def hold(self):
        import torch._inductor.config as inductor_config
        if self._saved is None:
            self._saved = inductor_config.reorder_for_peak_memory
            inductor_config.reorder_for_peak_memory = False

    def release(self):
        if self._saved is not None:
            import torch._inductor.config as inductor_config
            inductor_config.reorder_for_peak_memory, self._saved = self._saved, None


class CompileMarker(TorchFunctionMode):
    """Pushed (under the L1 mode, if any) while a compiled model is dumped at L0, mix or L2: the
    torch-function mode stack, compared by the modes' types, is what Dynamo guards (module hooks are not),
    so each of these levels gets compiled code of its own with its hooks in it, and plain steps keep
    theirs. `marker(level)` gives one of a class per level."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


_MARKERS = {}


def marker(level):
    cls = _MARKERS.get(level)
    if cls is None:
        cls = _MARKERS[level] = type(f"CompileMarker{level}", (CompileMarker,), {})
    return cls()


# -- run time ---------------------------------------------------------------------------------------

_TORCH_DIR = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "")
# frames between the mode and the code that called an API (Python-level torch functions)
_PASS_THROUGH = tuple(os.path.join(_TORCH_DIR, f) for f in ("overrides.py", "nn/functional.py", "functional.py",
                                                           "_tensor.py"))
_COMPILER = tuple(os.path.join(_TORCH_DIR, d) for d in (
    "_dynamo", "_functorch", "_inductor", "_higher_order_ops", "_subclasses", "_library", "_ops.py", "fx",
    "_prims", "_refs", "_decomp", "_guards.py", "_compile.py", "autograd/function.py"))
# what runs a compiled graph (an FX GraphModule called from here is Dynamo's, not the user's)
_COMPILER_RUNTIME = tuple(os.path.join(_TORCH_DIR, d) for d in ("_dynamo", "_functorch", "_inductor"))
_from_compiler = {}  # id(code) -> whether its calls are the compiler's own


def called_by_compiler(depth=2):
    """True when the torch API reaching the mode was called by compiled code or the compiler itself
    (an Inductor kernel wrapper's `mm`, AOTAutograd's `detach`, Dynamo's own tensor reads), not by the
    user's code running between graphs. Asked only while a compiled model may run."""
    frame = sys._getframe(depth)
    while frame is not None and frame.f_code.co_filename.startswith(_PASS_THROUGH):
        frame = frame.f_back
    if frame is None:
        return False
    code = frame.f_code
    hit = _from_compiler.get(id(code))
    if hit is None:
        path = code.co_filename
        hit = path.startswith(_COMPILER) or "torchinductor_" in path  # (Inductor's generated code)
        if path.startswith("<eval_with_key>"):  # an FX GraphModule: Dynamo's (aot_eager, eager), or the user's
            hit = _called_by(frame, _COMPILER_RUNTIME)
        _from_compiler[id(code)] = hit
    return hit


def _called_by(frame, dirs, depth=6):
    for _ in range(depth):
        frame = frame.f_back
        if frame is None:
            return False
        if frame.f_code.co_filename.startswith(dirs):
            return True
    return False


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

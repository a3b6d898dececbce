"""Capture inside torch.compile: records made by an op the compiled graph keeps and runs, not by graph
breaks.

While Dynamo traces a dumped model, the L1 mode (capture/api_mode.py) and the L0 hooks
(capture/modules.py) take the paths here instead of recording: each recorded call puts one
`msprobe::record` op into the graph, a custom op registered with an ordered effect, so Dynamo keeps
it, AOTAutograd threads it in program order and Inductor neither drops nor reorders it. At run time
the op's body (capture/compiled_calls.py) makes the same records the eager path makes, through the
session's own record builders: the API or module name, arguments and outputs from the site the graph
carries (capture/compiled_sites.py), the counters, the module stack and the filters read live.

Backward: the inputs of a call that need a gradient are passed to it as aliases (`aten.alias`, free
in a compiled graph) with a tensor hook, and its outputs get a hook; Dynamo compiles the hooks into the
backward graph, where they run the same op with the gradient. A call's input hooks see exactly the
gradient that flows through that call, as the eager tracker's node hooks do.
Guarded by benchmarks/compile_overhead.py.
"""

import functools
import os
import sys

import torch
from torch.overrides import TorchFunctionMode

from msprobe.pytorch import _state
from msprobe.pytorch.capture.compiled_calls import BEGIN, CALL, END, IN_GRAD, OUT_GRAD, CompiledCalls
from msprobe.pytorch.capture.compiled_functions import inside_function
from msprobe.pytorch.capture.compiled_sites import api_name, describe, outputs_text, site_of, site_text
from msprobe.pytorch.tensor_subclasses import is_dtensor
from msprobe.pytorch.tool_work import tool_work

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
    if info is None or inside_function():  # a custom Function's ops: folded into its records
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
    # (a DTensor, FSDP2's shard, cannot join the plain tensors of the record op: left out, see compile_notes)
    params = [(n, p) for n, p in module._parameters.items() if p is not None and not is_dtensor(p)]
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
    if _has_dtensor_parameters(models):
        notes.append("msprobe: DTensors (FSDP2, tensor parallelism) inside compiled code are recorded by their type, "
                     "without statistics: the compiled graph's record op takes plain tensors, and a local shard "
                     "alone would read as the whole tensor (a compiled module's record holds no DTensor parameters)")
    for name, config in _backends(models):
        if name not in _BACKENDS_RUNNING_OPS:
            notes.append(f"msprobe: torch.compile backend {name!r}: msprobe records through a custom op "
                         f"(msprobe::record) that {name!r} may not run; if a dumped step fails to compile, dump "
                         "with backend 'inductor' or 'aot_eager'")
        if (config or {}).get("triton.cudagraphs"):
            notes.append("msprobe: torch.compile mode 'reduce-overhead': graphs that hold msprobe's record op run "
                         "without CUDA graphs in dumped steps (the numbers are the same; the step is slower)")
    return notes


def _has_dtensor_parameters(models):
    roots = [models] if isinstance(models, torch.nn.Module) else list(models or ())
    return any(is_dtensor(p) for root in roots for p in root.parameters())


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


# -- run time: the torch calls that reach the L1 mode from compiled code ----------------------------

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


_graphs_seen = False  # Dynamo has compiled a graph in this process (it stays so)
_compile_started = False  # Dynamo started a compile while watched (it stays so)
_on_compile = []  # what watch_compiles was asked to call when Dynamo starts a compile


def watch_compiles(on_start):
    """Whether the L1 mode may put its C handler in front of its Python one (api_mode.ApiCapture._pass_on):
    Dynamo has compiled nothing in this process, and `on_start()` is called when it starts to (a start
    callback of torch._dynamo.callback, registered here; torch._dynamo.reset() drops those, so this is
    asked at every start()). Once a compile has started the answer stays no: code compiled through the
    Python handler guards on it."""
    if _compile_started or _graphs_made():
        return False
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:  # a torch without compile callbacks
        return False
    if on_start not in _on_compile:
        _on_compile.append(on_start)
    if _compiling not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_compiling)
    return True


def _graphs_made():
    """Whether Dynamo has compiled a graph in this process (.get: a Counter's missing key is a Python call)."""
    return torch._dynamo.utils.counters["stats"].get("unique_graphs", 0) > 0


def _compiling(args):
    global _compile_started
    _compile_started = True
    for on_start in _on_compile:
        on_start()


def called_by_compiler(depth=2):
    """True when the torch API reaching the mode was called by compiled code or the compiler itself
    (an Inductor kernel wrapper's `mm`, AOTAutograd's `detach`, Dynamo's own tensor reads), not by the
    user's code running between graphs. Asked only while a compiled model may run."""
    global _graphs_seen
    if not _graphs_seen:  # nothing compiled yet (torch imports Dynamo for far more than torch.compile)
        _graphs_seen = _graphs_made()  # (asked by every API call until a graph is made)
        if not _graphs_seen:
            return False
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

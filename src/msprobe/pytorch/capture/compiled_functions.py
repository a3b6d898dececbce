"""A user's custom autograd Function inside torch.compile (L1, mix): recorded as eager L1 records it, as API
`Function.{class}` with a forward record and a backward record whose own gradients in and out say
whether its hand-written backward is right.

Dynamo does not call `Function.apply` (the eager wrapper in capture/patched_api.py never runs): it
traces the class's `forward` and `backward` into a graph pair of their own. So while a compiled model is
dumped each user Function's `forward` and `backward` are replaced by wrappers that Dynamo traces
in their place. The forward wrapper puts the Function's call event into the graph (its site, the same
text the API calls carry, kept on `ctx`); the backward wrapper puts in the gradient events of that site,
the incoming gradients first, then the ones it returns, which the run-time side (capture/compiled_calls.py)
pairs into the backward record as it does an API's hooks. The ops inside the Function's forward and
backward are folded into its records (`inside_function`), as in eager. Outside Dynamo's tracing the
wrappers call straight through; stop() puts the originals back.

A Function defining `setup_context` (forward without ctx) makes its call event in `setup_context`, which
receives the inputs and the output. Must not import torch._dynamo at import time.
"""

import functools

import torch

from msprobe.pytorch.capture.compiled_calls import CALL, IN_GRAD, OUT_GRAD
from msprobe.pytorch.capture.compiled_sites import describe, outputs_text, site_text, trace_constant, translators

_SITE, _SLOTS = "_msprobe_site", "_msprobe_slots"  # ctx attributes the forward leaves for the backward
_installed = False  # some class has its wrappers now: only then is the traced stack searched for them


def set_installed(on):
    global _installed
    _installed = on


def user_functions():
    """The autograd.Function subclasses defined outside torch, with forward and backward of their own."""
    from torch.autograd.function import Function
    out, todo, seen = [], [Function], set()
    while todo:
        for sub in type.__subclasses__(todo.pop()):
            if sub in seen:
                continue
            seen.add(sub)
            todo.append(sub)
            d = sub.__dict__
            if (not sub.__module__.startswith("torch.") and isinstance(d.get("forward"), staticmethod)
                    and isinstance(d.get("backward"), staticmethod)
                    and isinstance(d.get("setup_context", staticmethod(None)), staticmethod)):
                out.append(sub)
    return out


def wrappers(cls):
    """{attribute: staticmethod} recording `cls` in compiled graphs (forward, backward, and setup_context
    where the class has one); the originals run as they are outside Dynamo's tracing."""
    d = cls.__dict__
    fwd, bwd = d["forward"].__func__, d["backward"].__func__
    setup = d["setup_context"].__func__ if "setup_context" in d else None
    name = cls.__name__

    @functools.wraps(fwd)  # Dynamo reads the signature (inspect follows __wrapped__)
    def forward(*args, **kwargs):
        if setup is not None or not torch.compiler.is_compiling():
            return fwd(*args, **kwargs)  # (traced, it still folds the ops inside)
        out = fwd(*args, **kwargs)
        _record_call(name, args[0], args[1:], kwargs, out)
        return out

    @functools.wraps(bwd)
    def backward(ctx, *grads):
        if not torch.compiler.is_compiling():
            return bwd(ctx, *grads)
        return _traced_backward(bwd, ctx, grads)

    made = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    if setup is not None:
        @functools.wraps(setup)
        def setup_context(ctx, inputs, output):
            setup(ctx, inputs, output)
            if torch.compiler.is_compiling():
                _record_call(name, ctx, tuple(inputs), {}, output)
        made["setup_context"] = staticmethod(setup_context)
    return made


# -- traced by Dynamo ------------------------------------------------------------------------------

def _record_call(name, ctx, inputs, kwargs, out):
    """The Function's call event after its forward: `inputs`, apply()'s arguments; `out`, its output."""
    ins, ints, floats = [], [], []
    a_desc = describe(inputs, ins, ints, floats)
    k_desc = describe(kwargs, ins, ints, floats)
    # (tensor index, argument position) of the inputs whose gradients the backward returns
    slots = tuple((d[1], p) for p, d in enumerate(a_desc[1]) if d[0] == "T" and d[2])
    grad_in = tuple(k for k, _ in slots)
    site = site_text("api", ("Function", name, False), None, a_desc, k_desc, None, grad_in, (), len(ins))
    outs = []
    o_desc = describe(out, outs, ints, floats)
    grad_out = tuple(i for i, t in enumerate(outs) if t.is_floating_point()) if slots else ()
    o_desc = _requiring_grad(o_desc, grad_out)  # traced under no_grad: as apply() returns them
    torch.ops.msprobe.record(ins + outs, [CALL] + ints, floats, site, outputs_text(o_desc, grad_out, False))
    if slots:
        setattr(ctx, _SITE, site)
        setattr(ctx, _SLOTS, slots)


def _requiring_grad(desc, grad_out):
    if desc[0] == "T":
        return ("T", desc[1], desc[1] in grad_out)
    if desc[0] == "L":
        return ("L", tuple(_requiring_grad(d, grad_out) for d in desc[1]))
    return desc


def _traced_backward(bwd, ctx, grads):
    """The gradient events of the Function's site around its backward: the gradients of its outputs
    (the backward's inputs), then the gradients it returns for its inputs."""
    site = getattr(ctx, _SITE, None)
    if site is None:
        return bwd(ctx, *grads)
    for i, g in enumerate(grads):
        if isinstance(g, torch.Tensor):
            torch.ops.msprobe.record([g], [OUT_GRAD, i], [], site, "")
    out = bwd(ctx, *grads)
    got = out if isinstance(out, tuple) else (out,)
    for k, p in getattr(ctx, _SLOTS):  # a None gradient too: the record is complete when the last one came
        g = got[p] if p < len(got) else None
        torch.ops.msprobe.record([g] if isinstance(g, torch.Tensor) else [], [IN_GRAD, k], [], site, "")
    return out


@trace_constant
def inside_function():
    """Dynamo is tracing the forward or backward of a wrapped Function (its ops fold into its records)."""
    return _installed and any(tx.f_code.co_filename == __file__ and tx.f_code.co_name in _WRAPPERS
                              for tx in translators())


_WRAPPERS = ("forward", "backward", "setup_context")

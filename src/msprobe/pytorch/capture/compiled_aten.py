"""Level L2 inside torch.compile: the aten ops an API dispatches, recorded where the compiled graph holds
their tensors and marked fused away where it does not.

Eager L2 records every aten op below each API. In a compiled graph those ops are Inductor's to fuse:
the tensors an API hands between its own aten ops (the transposed weight inside F.linear, the exp inside
softmax) are computed inside kernels and never exist. While Dynamo traces an API, `aten_plan` runs it
once on meta tensors of the same shapes to list the aten ops eager would record, each argument and
output named as an input of the API, an output of the API, or an internal tensor. At run time
(`emit_aten_records`) the first two get statistics from the tensors the record op receives; an
internal one is recorded with its dtype and shape, no statistics and `"fused_away": true`, which
compare shows as "fused away" rather than as a mismatch. Aten ops of the compiled backward are not
recorded (the debugger says so at start()).

Must not import torch._dynamo at import time.
"""

import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from msprobe.core import naming
from msprobe.pytorch.capture.compiled_sites import rebuild, trace_constant

FUSED_AWAY = "fused_away"  # the field a fused-away tensor record carries (true)


class _PlanMode(TorchDispatchMode):
    """Notes each aten op (name, arguments, result) a call dispatches on meta tensors."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # requires_grad as eager's aten mode sees it: below autograd, an output does not require one yet
        grads = {id(t): t.requires_grad for t in _flat(list(args) + list(kwargs.values())) + _flat(out)}
        self.ops.append((func.__name__, args, kwargs, out, grads))
        return out


@trace_constant
def aten_plan(func, args, kwargs, metas):
    """The aten ops eager's L2 records for `func` on inputs of these layouts and metas ((shape, stride,
    dtype, requires_grad) per input tensor), as JSON; "" when the call cannot be run on meta tensors."""
    ins = [torch.empty_strided(shape, stride, dtype=dtype, device="meta").requires_grad_(rg and dtype.is_floating_point)
           for shape, stride, dtype, rg in metas]
    try:
        with _PlanMode() as mode:
            out = func(*rebuild(args, ins, ()), **rebuild(kwargs, ins, ()))
    except Exception:  # an API meta tensors cannot run (data-dependent shapes): no aten records
        return ""
    names = {id(t): ("I", i) for i, t in enumerate(ins)}
    for j, t in enumerate(_flat(out)):
        names.setdefault(id(t), ("O", j))
    plan = [[name, [_layout(x, names, grads) for x in a], {k: _layout(v, names, grads) for k, v in kw.items()},
             _layout(o, names, grads)] for name, a, kw, o, grads in mode.ops]
    return json.dumps(plan, separators=(",", ":"))


def _flat(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _flat(x)]
    return []


def _layout(v, names, grads):
    """An aten op's value: a tensor as its name (input/output of the API, or internal with its metadata)
    and requires_grad, containers item by item, anything else as the record eager writes for it."""
    if isinstance(v, torch.Tensor):
        rg = grads.get(id(v), v.requires_grad)
        name = names.get(id(v))
        return [name[0], name[1], rg] if name else ["X", str(v.dtype), list(v.shape), rg]
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        return ["L", [_layout(x, names, grads) for x in v]]
    if isinstance(v, torch.Size):
        return ["Z", list(v)]
    # any other value as the record eager writes for it
    from msprobe.core.dump.json_append import scalar_record
    from msprobe.pytorch.session import other_value_record
    if v is None:
        return ["R", None]
    return ["R", scalar_record(v) if isinstance(v, (bool, int, float, str)) else other_value_record(v)]


def emit_aten_records(session, plan_text, api_key, inputs, outputs, stack):
    """Records of the aten ops in a plan, under API `api_key` (their parent in construct.json)."""
    flt = session.filter
    gate = session.gate
    for name, args, kwargs, out in _plan_of(plan_text):
        key = naming.api_key("Aten", name, session.counter.next("Aten." + name), naming.FORWARD)
        if not flt.forward or not flt.want_call(key, session.module_stack) or (gate is not None and gate.exhausted):
            continue
        save = flt.saves_tensor(key) or gate is not None
        waits = []
        values = _Values(session, inputs, outputs, save, waits)
        in_args = [values.record(v, f"{key}.input.{i}") for i, v in enumerate(args)] if flt.input else []
        in_kwargs = {k: values.record(v, f"{key}.input.{k}") for k, v in kwargs.items()} if flt.input else {}
        outs = (values.record(out, f"{key}.output") if out[0] == "L" else [values.record(out, f"{key}.output.0")])
        record = {"input_args": in_args, "input_kwargs": in_kwargs, "output": outs if flt.output else []}
        session.emit(key, record, waits, check=outs)
        session.note_structure(key, api_key, stack)


_PLANS = {}


def _plan_of(text):
    plan = _PLANS.get(text)
    if plan is None:
        plan = _PLANS[text] = json.loads(text) if text else []
    return plan


class _Values:
    """Records of plan values: the API's tensors through the session's own builder, internal ones fused away."""

    __slots__ = ("session", "inputs", "outputs", "save", "waits")

    def __init__(self, session, inputs, outputs, save, waits):
        self.session, self.inputs, self.outputs, self.save, self.waits = session, inputs, outputs, save, waits

    def record(self, v, stem):
        tag = v[0]
        if tag == "I" or tag == "O":
            t = (self.inputs if tag == "I" else self.outputs)[v[1]]
            rec = self.session.value_record(t, stem, self.save, self.waits)
            rec["requires_grad"] = v[2]  # as eager's tensor has it (inside a graph none requires a gradient)
            return rec
        if tag == "X":
            return fused_record(self.session, v[1], v[2], v[3])
        if tag == "L":
            return [self.record(x, f"{stem}.{i}") for i, x in enumerate(v[1])]
        if tag == "Z":
            return {"type": "torch.Size", "value": v[1]}
        return dict(v[1]) if v[1] is not None else None


def fused_record(session, dtype, shape, requires_grad):
    """A tensor the compiled program never holds: its dtype and shape, no statistics, `fused_away`."""
    rec = {"type": "torch.Tensor", "dtype": dtype, "shape": shape}
    cfg = session.cfg
    if cfg.wants_stats:
        rec.update(Max=None, Min=None, Mean=None, Norm=None)
    if cfg.summary_mode == "md5":
        rec["md5"] = None
    rec["requires_grad"] = requires_grad
    rec[FUSED_AWAY] = True
    return rec

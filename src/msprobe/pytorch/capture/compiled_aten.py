"""Level L2 inside torch.compile: the aten ops an API dispatches, recorded where the compiled graph holds
their tensors and marked fused away where it does not.

Eager L2 records every aten op below each API. In a compiled graph those ops are Inductor's to fuse:
the tensors an API hands between its own aten ops (the transposed weight inside F.linear, the exp inside
softmax) are computed inside kernels and never exist. At run time `aten_plan` runs the API once on
meta tensors of the same shapes (once per call site and shapes) to list the aten ops eager would
record, each argument and output named as an input of the API, an output of the API, or an internal
tensor. `emit_aten_records` gives the first two statistics from the tensors the record op receives; an
internal one is recorded with its dtype and shape, no statistics and `"fused_away": true`, which
compare shows as "fused away" rather than as a mismatch. Aten ops of the compiled backward are not
recorded (the debugger says so at start()).

Must not import torch._dynamo at import time.
"""

import functools
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from msprobe.core import naming
from msprobe.core.dump.json_append import scalar_record
from msprobe.pytorch.capture.api_table import build_api_table
from msprobe.pytorch.capture.compiled_sites import rebuild, tensor_slots
from msprobe.pytorch.session import other_value_record

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


def aten_plan(site, tensors, ints, floats):
    """The aten ops eager's L2 records for the API of `site` on inputs like these (their shapes, strides,
    dtypes, and the call's ints and floats): the API run once on meta tensors; [] when it cannot be."""
    ins = tensors[:site.n_in]
    key = (site.pair, tuple((tuple(t.shape), t.stride(), t.dtype) for t in ins), tuple(ints), tuple(floats))
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    input_grads = {slot[1]: slot[2] for desc in (site.args, site.kwargs) for slot in tensor_slots(desc)}
    metas = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta").requires_grad_(
        bool(input_grads.get(i)) and t.dtype.is_floating_point) for i, t in enumerate(ins)]
    func = _api_function(site.prefix, site.name)
    plan = []
    if func is not None:
        # on a thread of its own: the op's body runs below autograd, where the API would not decompose
        # into the aten ops eager dispatches (and grad mode is on there, as in a training forward)
        ran = []
        worker = threading.Thread(target=_run_on_meta, args=(func, site, metas, ints, floats, ran))
        worker.start()
        worker.join()
        if ran:
            mode, out = ran[0]
            names = {id(t): ("I", i) for i, t in enumerate(metas)}
            for j, t in enumerate(_flat(out)):
                names.setdefault(id(t), ("O", j))
            plan = [[name, [_layout(x, names, grads) for x in a], {k: _layout(v, names, grads) for k, v in kw.items()},
                     _layout(o, names, grads)] for name, a, kw, o, grads in mode.ops]
    if len(_PLANS) >= 4096:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


_PLANS = {}  # (site, input metadata, ints, floats) -> plan


def _run_on_meta(func, site, metas, ints, floats, ran):
    try:
        with _PlanMode() as mode:
            out = func(*rebuild(site.args, metas, ints, floats), **rebuild(site.kwargs, metas, ints, floats))
    except Exception:  # an API meta tensors cannot run (data-dependent shapes): no aten records
        return
    ran.append((mode, out))


@functools.lru_cache(maxsize=None)
def _api_function(prefix, name):
    """The callable an API record names (`Tensor.__add__` from an operator included)."""
    for func, (p, n) in build_api_table().items():
        if p == prefix and n == name:
            return func
    return getattr(torch.Tensor, name, None) if prefix == "Tensor" else None


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
    if v is None:
        return ["R", None]
    return ["R", scalar_record(v) if isinstance(v, (bool, int, float, str)) else other_value_record(v)]


def emit_aten_records(session, site, api_key, tensors, ints, floats):
    """Records of the aten ops API call `api_key` dispatches (their parent in construct.json); `tensors`:
    the call's inputs, then its outputs."""
    flt = session.filter
    gate = session.gate
    stack = site.stack if session.with_stack else None
    inputs, outputs = tensors[:site.n_in], tensors[site.n_in:]
    for name, args, kwargs, out in aten_plan(site, tensors, ints, floats):
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

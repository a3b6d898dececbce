"""Call sites inside torch.compile: what Dynamo knows while it traces a call, carried to run time as one
string the compiled graph holds as a constant.

While Dynamo traces, msprobe's capture code runs symbolically: it must not read the session (a guard on
it would recompile every step) and cannot build records. So each recorded call is described instead —
the API or module, the layout of its arguments and outputs with every tensor and symbolic int replaced
by a slot (`describe`, traced), the positions that get backward hooks, and the user's stack — and the
description is turned into JSON by a function Dynamo runs for real and treats as a constant
(`api_name`, `site_text`). At run time the record op parses it once (`site_of`) and rebuilds the
arguments and outputs around the tensors it receives, so records are made by the eager code path.

Must not import torch._dynamo at import time (it is loaded only when a model is compiled).
"""

import functools
import json
import math
import os
import sys

import torch

from msprobe.pytorch.capture.api_table import build_api_table, is_inplace
from msprobe.pytorch.capture.operator_names import OPERATOR_METHODS, instruction_operator
from msprobe.pytorch.tensor_subclasses import is_dtensor

_MSPROBE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
# outer frames of the compiler itself, left out of a compiled call's stack
_COMPILER_DIRS = tuple(os.path.join(_TORCH_DIR, d) for d in (
    "_dynamo", "_functorch", "_inductor", "fx", "_compile.py", "_guards.py", "_higher_order_ops", "utils"))
_STACK_LIMIT = 30
# traced frames that are not the user's: msprobe's own, Dynamo's helper around a custom Function's forward
_TRACED_NOT_USER = (_MSPROBE_DIR, os.path.join(_TORCH_DIR, "_functorch", "autograd_function.py"))


def trace_constant(fn):
    """Dynamo runs `fn` while tracing and puts its result in the graph as a constant (what
    `torch._dynamo.assume_constant_result` marks, without importing Dynamo)."""
    fn._dynamo_marked_constant = True
    return fn


# -- traced: argument layouts ---------------------------------------------------------------------

def describe(v, tensors, ints, floats):
    """Layout of `v` as nested tuples of constants; tensors, ints and floats become slots holding their
    index in `tensors`, `ints`, `floats` (appended in `flat_tensors` order). Runs under Dynamo, where a
    symbolic int passes for an int: every number travels through the op's lists, never as a constant."""
    if isinstance(v, torch.Tensor) and not is_dtensor(v):  # (requires_grad as the eager tensor has it)
        tensors.append(v)
        return ("T", len(tensors) - 1, v.requires_grad)
    if isinstance(v, bool) or v is None or v is Ellipsis or isinstance(v, (str, torch.dtype, torch.device,
                                                                          torch.memory_format, torch.layout)):
        return ("C", v)
    if isinstance(v, int):
        ints.append(v)
        return ("S", len(ints) - 1)
    if isinstance(v, float):
        floats.append(v)
        return ("N", len(floats) - 1)
    if isinstance(v, torch.Size):
        return ("Z", tuple(describe(x, tensors, ints, floats) for x in v))
    if isinstance(v, (list, tuple)):
        return ("L", tuple(describe(x, tensors, ints, floats) for x in v))
    if isinstance(v, dict):
        return ("D", tuple((str(k), describe(x, tensors, ints, floats)) for k, x in v.items()))
    if isinstance(v, slice):
        return ("SL", describe(v.start, tensors, ints, floats), describe(v.stop, tensors, ints, floats),
                describe(v.step, tensors, ints, floats))
    # an object Dynamo traced through, by its type; a DTensor too (tensor parallelism): msprobe::record takes
    # plain tensors only, and its local shard alone would read as the whole tensor
    return ("O", type(v).__module__, type(v).__qualname__)


# -- run by Dynamo as constants --------------------------------------------------------------------

@trace_constant
def api_name(func):
    """(prefix, name, in place, position of an `inplace` flag) of an API Dynamo is tracing, or None when
    it is not recorded; `x + y` is named `__add__` from the instruction Dynamo is at."""
    from msprobe.pytorch.capture.api_mode import inplace_flag_position
    info = build_api_table().get(func)
    if info is None:
        return None
    prefix, name = info
    if prefix == "Tensor" and name in OPERATOR_METHODS:
        name = _traced_operator() or name
    flag = inplace_flag_position(func) if prefix == "Functional" else None
    return prefix, name, is_inplace(name), flag


@trace_constant
def site_text(kind, head, func, args, kwargs, outputs, grad_in, grad_out, n_in):
    """The site of one recorded call or module boundary as JSON. `head`: (prefix, name, in place) of an
    API, (module base,) or (module base, parameter names) of a module; `func`: the API, whose arguments
    are laid out as eager's mode receives them; `grad_in`/`grad_out`: positions of the input/output
    tensors whose gradients are hooked."""
    order = None
    if func is not None:
        args, kwargs = eager_layout(func, args, kwargs)
        order = [slot[1] for slot in tensor_slots(("L", (args, kwargs)))]  # eager's input positions -> the op's
    site = {"k": kind, "h": list(head), "a": _json(args), "kw": _json(kwargs), "o": _json(outputs),
            "gi": list(grad_in), "go": list(grad_out), "n": n_in, "st": _traced_stack()}
    if order is not None and order != sorted(order):
        site["im"] = order
    return json.dumps(site, separators=(",", ":"))


@trace_constant
def outputs_text(outputs, grad_out, aten):
    """An API call's outputs (their layout, the positions whose gradients are hooked, whether its aten ops
    are recorded: L2) as JSON: known only once the call ran, while its site is needed before (an input's
    hook is set before the call)."""
    return json.dumps([_json(outputs), list(grad_out), aten], separators=(",", ":"))


@functools.lru_cache(maxsize=4096)
def outputs_of(text):
    """(outputs layout, hooked output positions, aten ops recorded) of an `outputs_text`."""
    desc, grad_out, aten = json.loads(text)
    return desc, tuple(grad_out), aten


def tensor_slots(desc):
    """The tensor slots ("T", index, requires_grad) of a layout (tuples, or lists read from JSON) in
    traversal (`flat_tensors`) order."""
    if not desc:
        return
    tag = desc[0]
    if tag == "T":
        yield desc
    elif tag in ("L", "Z"):
        for x in desc[1]:
            yield from tensor_slots(x)
    elif tag == "D":
        for _, x in desc[1]:
            yield from tensor_slots(x)


class _Captured(Exception):
    def __init__(self, args, kwargs):
        super().__init__()
        self.layout = (args, kwargs)


class _Slot:
    """Stands for an argument while a Python-level torch function is run to see how it hands its
    arguments to `handle_torch_function`; a tensor slot triggers that hand-over."""

    __slots__ = ("desc",)

    def __init__(self, desc):
        self.desc = desc


class _TensorSlot(_Slot):
    __slots__ = ()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        raise _Captured(args, kwargs or {})


def eager_layout(func, args, kwargs):
    """The (args, kwargs) layouts as eager's mode receives them. A torch function written in Python
    (F.layer_norm, F.softmax, Tensor.split) passes `handle_torch_function` a layout of its own (F.layer_norm
    hands over weight, bias and eps by name), while Dynamo hands the mode the caller's: run the function
    on stand-ins until it hands them over."""
    if not hasattr(func, "__code__"):
        return args, kwargs  # a builtin: the mode gets the caller's arguments as they are
    try:
        func(*_standin(args), **_standin(kwargs))
    except _Captured as got:
        return _layout_of(list(got.layout[0])), _layout_of(got.layout[1])
    except Exception:  # anything the stand-ins cannot go through: the caller's layout
        return args, kwargs
    return args, kwargs


def _standin(desc):
    tag = desc[0]
    if tag == "L":
        return [_standin(x) for x in desc[1]]
    if tag == "D":
        return {k: _standin(x) for k, x in desc[1]}
    if tag == "C":
        return desc[1]
    return (_TensorSlot if tag == "T" else _Slot)(desc)


def _layout_of(v):
    if isinstance(v, _Slot):
        return v.desc
    if isinstance(v, (list, tuple)):
        return ("L", tuple(_layout_of(x) for x in v))
    if isinstance(v, dict):
        return ("D", tuple((str(k), _layout_of(x)) for k, x in v.items()))
    return ("C", v)


def _json(desc):
    if desc is None:
        return None
    tag = desc[0]
    if tag in ("L", "Z"):
        return [tag, [_json(x) for x in desc[1]]]
    if tag == "D":
        return [tag, [[k, _json(x)] for k, x in desc[1]]]
    if tag == "SL":
        return [tag, _json(desc[1]), _json(desc[2]), _json(desc[3])]
    if tag != "C":
        return list(desc)
    v = desc[1]
    if v is Ellipsis:
        return ["E"]
    if isinstance(v, (torch.dtype, torch.memory_format, torch.layout)):
        return ["A", str(v).rsplit(".", 1)[-1]]  # an attribute of torch: torch.float32, torch.strided
    if isinstance(v, torch.device):
        return ["V", str(v)]
    if v is None or isinstance(v, (bool, int, str)) or isinstance(v, float) and math.isfinite(v):
        return ["C", v]
    return ["O", type(v).__module__, type(v).__qualname__]


def translators():
    """Dynamo's instruction translators on the Python stack, innermost first (one per traced frame)."""
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase
    out, seen = [], set()
    frame = sys._getframe(2)
    while frame is not None:
        tx = frame.f_locals.get("self")
        if isinstance(tx, InstructionTranslatorBase) and id(tx) not in seen:
            seen.add(id(tx))
            out.append(tx)
        frame = frame.f_back
    return out


def _traced_operator():
    """The dunder of the user's instruction that made Dynamo call the mode (msprobe's own frames skipped)."""
    for tx in translators():
        if not tx.f_code.co_filename.startswith(_MSPROBE_DIR):
            inst = tx.current_instruction
            return instruction_operator(inst.opcode, inst.arg) if inst is not None else None
    return None


def _traced_stack():
    """The user's stack at the traced call, innermost first, as (file, line, function): the frames Dynamo
    is tracing, then the real frames that called the compiled code (the compiler's own left out)."""
    frames = [(tx.f_code.co_filename, tx.lineno or tx.f_code.co_firstlineno, tx.f_code.co_name)
              for tx in translators() if not tx.f_code.co_filename.startswith(_TRACED_NOT_USER)]
    frame = sys._getframe(1)
    outer = []
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(_COMPILER_DIRS) or path.startswith(_MSPROBE_DIR):
            outer = []  # everything inside the compiler so far was Dynamo itself: start again past it
        else:
            outer.append((path, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return (frames + outer)[:_STACK_LIMIT]


# -- run time: a site's string parsed once -----------------------------------------------------------

class Site:
    """One call site as the record op sees it at run time.

    Attributes:
        kind: "api", "begin" (module pre-hook) or "end" (module post-hook).
        prefix, name, inplace: the API's (kind "api"); `base`: "Module.{path}.{Class}" (module kinds).
        params: parameter names of a module's own parameters (kind "end"; their tensors follow the outputs).
        grad_in, grad_out: hooked input / output positions. n_in: input tensors of the call.
        stack: (file, line, function) tuples, innermost first. pair: what a backward event is paired by.
    """

    __slots__ = ("kind", "prefix", "name", "inplace", "base", "params", "args", "kwargs", "outputs", "grad_in",
                 "grad_out", "n_in", "stack", "pair", "in_position")

    def __init__(self, text):
        d = json.loads(text)
        self.kind = d["k"]
        head = d["h"]
        self.prefix = self.name = self.base = None
        self.inplace = False
        self.params = ()
        if self.kind == "api":
            self.prefix, self.name, self.inplace = head
            self.pair = text  # forward and backward hooks of one call carry the same text
        else:
            self.base = head[0]
            self.params = tuple(head[1]) if len(head) > 1 else ()
            self.pair = self.base  # a module's pre- and post-hook sites differ; its path does not
        self.args, self.kwargs, self.outputs = d["a"], d["kw"], d["o"]
        # an input's position in eager's layout, from its index among the op's tensors (hooks carry those)
        order = d.get("im")
        self.in_position = {i: pos for pos, i in enumerate(order)} if order else None
        self.grad_in = tuple(self.eager_position(i) for i in d["gi"])
        self.grad_out = tuple(d["go"])
        self.n_in = d["n"]
        self.stack = tuple(tuple(f) for f in d["st"])

    def eager_position(self, index):
        return index if self.in_position is None else self.in_position[index]


@functools.lru_cache(maxsize=4096)
def site_of(text):
    return Site(text)


def rebuild(desc, tensors, ints, floats):
    """The value a layout describes, with the run's tensors, ints and floats (lists) in its slots."""
    tag = desc[0]
    if tag == "T":
        return tensors[desc[1]]
    if tag == "C":
        return desc[1]
    if tag == "S":
        return ints[desc[1]]
    if tag == "N":
        return floats[desc[1]]
    if tag == "L":
        return [rebuild(x, tensors, ints, floats) for x in desc[1]]
    if tag == "D":
        return {k: rebuild(x, tensors, ints, floats) for k, x in desc[1]}
    if tag == "A":
        return getattr(torch, desc[1])
    if tag == "Z":
        return torch.Size([rebuild(x, tensors, ints, floats) for x in desc[1]])
    if tag == "SL":
        return slice(*(rebuild(d, tensors, ints, floats) for d in desc[1:]))
    if tag == "V":
        return torch.device(desc[1])
    if tag == "E":
        return Ellipsis
    return _opaque_type(desc[1], desc[2])()  # "O": an object Dynamo traced through, recorded by its type


@functools.lru_cache(maxsize=None)
def _opaque_type(module, qualname):
    """A stand-in class named as the traced object's type: its record is that type's name, as in eager."""
    return type(qualname.rsplit(".", 1)[-1], (), {"__module__": module, "__qualname__": qualname})


def mark_requires_grad(desc, rec):
    """Set each tensor record's requires_grad in `rec` (built from `rebuild(desc, ...)`) to the traced
    tensor's: the tensors a compiled graph hands over never require a gradient themselves."""
    if desc is None or rec is None:
        return
    tag = desc[0]
    if tag == "T":
        if isinstance(rec, dict) and len(desc) > 2:
            rec["requires_grad"] = desc[2]
    elif tag == "L" and isinstance(rec, list):
        for d, r in zip(desc[1], rec):
            mark_requires_grad(d, r)
    elif tag == "D" and isinstance(rec, dict):
        for k, d in desc[1]:
            mark_requires_grad(d, rec.get(k))


def mark_outputs(desc, outs):
    """`mark_requires_grad` for an `outputs_record` list (a list or tuple output is recorded item by item)."""
    if desc is not None and outs:
        mark_requires_grad(desc, outs if desc[0] == "L" else outs[0])

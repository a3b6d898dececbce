"""L1 capture: a TorchFunctionMode that records every public torch / functional / Tensor API call.

The handler runs with the mode popped, so calls made inside a captured API are not seen (nested calls
fold for free). No attribute of torch is patched. Guarded by benchmarks/dump_overhead.py.
"""

import inspect
import os
import sys
import weakref

from torch.overrides import TorchFunctionMode

from msprobe.pytorch import _state
from msprobe.pytorch.capture.api_table import argument_writers, build_api_table, is_inplace, sets_data
from msprobe.pytorch.capture.operator_names import OPERATOR_METHODS, operator_name, operator_table
from msprobe.pytorch.capture.recompute import graph_task_id, recomputing
from msprobe.pytorch.session import flat_tensors


def inplace_flag_position(func):
    """Position of an `inplace` parameter (F.relu(x, inplace=True) changes x), or None."""
    try:
        params = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):  # builtins without a signature
        return None
    return params.index("inplace") if "inplace" in params else None


try:
    from msprobe._call import PassOn as _PassOn
except ImportError:  # not built (no C compiler): the Python handler takes every call
    _PassOn = None

# modes with the C handler in front of their Python one now
_passing_on = weakref.WeakSet()


def _step_aside():
    """Every mode's C handler leaves: Dynamo is about to trace the mode, which it does through the Python
    handler (a C one would break its graph at every call)."""
    for mode in list(_passing_on):
        mode.__dict__.pop("__torch_function__", None)
    _passing_on.clear()


# modules that pass a call on for their caller (handle_torch_function; autograd.Function.apply views
# the inputs a Function returns)
_PASS_THROUGH = frozenset({"torch.overrides", "torch.nn.functional", "torch.functional", "torch._tensor",
                           "torch.autograd.function"})


def _called_by_distributed():
    """The call comes from torch.distributed's own code (FSDP2's parameter copies, DTensor's to_local and
    redistribution): the framework's plumbing, which a single-device run of the model does not have."""
    frame = sys._getframe(2)  # 0: here, 1: __torch_function__
    name = frame.f_globals.get("__name__", "")
    while name in _PASS_THROUGH and frame.f_back is not None:
        frame = frame.f_back
        name = frame.f_globals.get("__name__", "")
    return name.startswith("torch.distributed.")


def _mutates(func, args, kwargs, flag, writes):
    return "out" in kwargs or (flag is not None and (kwargs.get("inplace") is True
                                                    or (len(args) > flag and args[flag] is True))) or (
        writes is not None and writes(args, kwargs))


class ApiCapture(TorchFunctionMode):
    """Records API calls into `_state.session` while entered (start() enters, stop() exits).

    Calls it does not record still tell the session when they change a tensor in place (an in-place
    name, `out=`, `inplace=True`): statistics waiting for a batch launch are launched first."""

    def __init__(self):
        super().__init__()
        table = build_api_table()
        # func -> (prefix, name, inplace, operator?, position of an `inplace` flag, whether a call writes
        # into an argument otherwise (api_table.argument_writers)), resolved once so the hot path is one
        # dict lookup
        writers = argument_writers()
        self._table = {f: (p, n, is_inplace(n), p == "Tensor" and n in OPERATOR_METHODS,
                           inplace_flag_position(f) if p == "Functional" else None, writers.get(f))
                       for f, (p, n) in table.items()}
        self._unrecorded = {}  # func -> changes an argument in place by its name
        self._distributed = False  # a process group is up: calls from torch.distributed's code are not recorded
        # capture/compiled.py while a compiled model may run (set by the debugger): Dynamo traces this
        # handler, and the code it compiles calls torch APIs of its own through it
        self.compiled = None
        self.aten = False  # level L2: records in compiled graphs hold the aten ops each API dispatches

    def __enter__(self):
        import torch.distributed as dist
        self._distributed = dist.is_available() and dist.is_initialized()
        self._pass_on()
        return super().__enter__()

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.__dict__.pop("__torch_function__", None)
        _passing_on.discard(self)
        return super().__exit__(exc_type, exc_val, exc_tb)

    def _pass_on(self):
        """Put the C handler (msprobe._call.PassOn) in front of `__torch_function__` (an instance attribute,
        which torch calls first): the calls this mode does not record then cost no Python frame, and those it
        records go straight to the session's C call path where nothing below needs asking. Only while
        Dynamo cannot trace the mode: with Dynamo loaded, when it has compiled nothing in this process
        and will say when it starts to (compiled.watch_compiles); without it, until it is imported."""
        if _PassOn is None or os.environ.get("MSPROBE_NATIVE_RECORD", "1") == "0":
            return
        on_dynamo = _step_aside
        if "torch._dynamo" in sys.modules:
            from msprobe.pytorch.capture import compiled
            if not compiled.watch_compiles(_step_aside):
                return
            on_dynamo = None
        self.__torch_function__ = _PassOn(self, self._table, _state, type(self).__torch_function__.__get__(self),
                                          on_dynamo, graph_task_id, operator_table())
        _passing_on.add(self)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        compiled = self.compiled
        if compiled is not None and compiled.is_compiling():
            return compiled.traced_api_call(func, args, kwargs, self.aten)
        info = self._table.get(func)
        session = _state.session
        # the compiler's own calls are asked about last: most calls reaching here (attribute reads,
        # nested calls) are passed on before that frame walk
        if (info is None or session is None or _state.busy or _state.depth
                or (self._distributed and _called_by_distributed()) or recomputing()):
            if (session is not None and not _state.busy and session.summarizer.deferred
                    and not (compiled is not None and compiled.called_by_compiler())):
                self._before_unrecorded(session, func, args, kwargs, info)
            return func(*args, **kwargs)
        if compiled is not None and compiled.called_by_compiler():
            return func(*args, **kwargs)
        prefix, name, inplace, maybe_operator, flag, writes = info
        if maybe_operator:
            name = operator_name(2) or name
            inplace = is_inplace(name)
        out_arg = "out" in kwargs
        # (_mutates, inline: asked for every recorded call)
        mutates = out_arg or (flag is not None and (kwargs.get("inplace") is True
                                                    or (len(args) > flag and args[flag] is True)))
        # a call that writes into an argument with no version bump (api_table.argument_writers: batch norm's
        # running statistics): the summaries waiting for it go first (it mutates), and what the summarizer
        # cached for its arguments goes once it has run (a second micro-batch's call would otherwise be
        # handed the first one's record of the running statistics)
        writer = writes is not None and writes(args, kwargs)
        inplace, mutates = inplace or out_arg, mutates or writer
        try:
            if session.api_level_l2:
                return session.record_call(prefix, name, func, args, kwargs, inplace, mutates)
            fast = session.fast_call
            if fast is not None:  # the same flow in C (msprobe._call)
                return fast(session, prefix, name, func, args, kwargs, inplace, mutates)
            # record_call's L1/mix case, without its frame
            return session.calls.call(session, prefix, name, func, args, kwargs, inplace, mutates)
        finally:
            if writer:
                session.summarizer.forget(flat_tensors(args) + flat_tensors(kwargs))

    def _before_unrecorded(self, session, func, args, kwargs, info):
        """A call not recorded (nested, private, not an API) that changes a tensor in place launches the
        waiting statistics first."""
        if info is not None:
            mutates = info[2] or _mutates(func, args, kwargs, info[4], info[5])
        else:
            by_name = self._unrecorded.get(func)
            if by_name is None:
                by_name = self._unrecorded[func] = (is_inplace(getattr(func, "__name__", "") or "")
                                                    or sets_data(func))
            mutates = by_name or "out" in kwargs or kwargs.get("inplace") is True
        if mutates:
            session.before_mutation(args, kwargs)

"""Capture of callables the function mode cannot see: torch.distributed collectives, user-registered
custom APIs and (at L1) the user's custom autograd Functions. Each is replaced by a thin wrapper while capture is on, and restored afterwards; the
wrapper checks one global and otherwise calls straight through.

Collectives are found by signature, not by a list: every public function of
torch.distributed.distributed_c10d that takes a `group` and a tensor or object argument.
"""

import functools
import inspect
import warnings

from msprobe.core.errors import MsprobeError
from msprobe.pytorch import _state

_DATA_PARAMS = ("tensor", "object", "output", "input", "scatter_list", "gather_list", "p2p_op_list")


@functools.lru_cache(maxsize=1)
def collective_names():
    """Names of the collectives (signature inspection is slow: computed once per process)."""
    import torch.distributed as dist
    if not dist.is_available():
        return []
    from torch.distributed import distributed_c10d as c10d
    with warnings.catch_warnings():  # inspecting deprecated aliases (reduce_op) warns
        warnings.simplefilter("ignore")
        return _collectives_of(c10d, dist)


def _collectives_of(c10d, dist):
    names = []
    for name in getattr(c10d, "__all__", dir(c10d)):
        func = vars(c10d).get(name)
        if name.startswith("_") or not inspect.isfunction(func) or getattr(dist, name, None) is not func:
            continue
        try:
            params = inspect.signature(func).parameters
        except (TypeError, ValueError):
            continue
        if "group" in params and any(p.startswith(_DATA_PARAMS) for p in params):
            names.append(name)
    return sorted(names)


# parameters a collective only writes into, and collectives that only write into their first one
_OUTPUT_PARAMS = frozenset({"output", "output_tensor", "output_tensor_list", "output_tensor_lists", "tensor_list",
                            "gather_list", "object_gather_list"})
_WRITES_FIRST = frozenset({"scatter", "recv", "irecv", "recv_object_list", "all_gather_object"})


def output_buffers(func, name):
    """Positions and names of the arguments collective `name` only writes into."""
    try:
        params = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return frozenset()
    outs = params[:1] if name in _WRITES_FIRST else [p for p in params if p in _OUTPUT_PARAMS]
    return frozenset(outs + [params.index(p) for p in outs])


def _wrap(orig, prefix, name, inplace, buffers=frozenset()):
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        session = _state.session
        if session is None or _state.busy or _state.depth:
            return orig(*args, **kwargs)
        return session.record_call(prefix, name, orig, args, kwargs, inplace=inplace, buffers=buffers)
    wrapper.__msprobe_original__ = orig
    return wrapper


def _wrap_function_apply(orig):
    """`autograd.Function.apply` recording a user's Function as API `Function.{class name}`: its forward
    and, through the autograd node it creates, its backward, whose own gradients in and out say whether
    its hand-written backward is right (at L1 no module record holds them). torch's own Functions
    (checkpoint, FSDP, compiled graphs) are plumbing, not the model's math: not recorded."""
    func = orig.__func__

    def apply(cls, *args, **kwargs):
        session = _state.session
        if session is None or _state.busy or _state.depth or cls.__module__.startswith("torch."):
            return func(cls, *args, **kwargs)
        return session.record_call("Function", cls.__name__, functools.partial(func, cls), args, kwargs)
    apply.__msprobe_original__ = orig
    return classmethod(apply)


class PatchedApis:
    """Installed wrappers, each remembered with the original it replaced."""

    def __init__(self):
        self._originals = {}  # (module, attr) -> original callable
        # (module, attr, original, prefix, name, inplace) -> wrapper, reused by the next start()
        self._wrappers = {}
        self._collective_wrappers = []  # (module, attr, original, wrapper) as the last start() set them
        self._compiled_functions = False  # user Functions' forward/backward are wrapped now

    def patch(self, module, attr, prefix, name=None, inplace=False, buffers=frozenset()):
        if (module, attr) in self._originals:
            return
        orig = getattr(module, attr, None)
        if not callable(orig):
            raise MsprobeError(f"register_custom_api: {getattr(module, '__name__', module)!s}.{attr} "
                               "is not a callable attribute")
        self._originals[(module, attr)] = orig
        spec = (module, attr, orig, prefix, name or attr, inplace)
        wrapper = self._wrappers.get(spec)
        if wrapper is None:
            wrapper = self._wrappers[spec] = _wrap(orig, prefix, name or attr, inplace, buffers)
        setattr(module, attr, wrapper)

    def restore(self, module=None, attr=None):
        """Restore one attribute, or every patched attribute when called without arguments."""
        items = [(module, attr)] if module is not None else list(self._originals)
        for key in items:
            orig = self._originals.pop(key, None)
            if orig is not None:
                setattr(key[0], key[1], orig)
        if module is None and self._compiled_functions:
            from msprobe.pytorch.capture.compiled_functions import set_installed
            set_installed(False)
            self._compiled_functions = False

    def patch_collectives(self):
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
        fast = self._collective_wrappers
        if fast and all(getattr(m, a, None) is orig for m, a, orig, _ in fast):
            # every start() patches ~50 attributes: once they are known, two dict writes each
            for m, a, orig, wrapper in fast:
                if (m, a) not in self._originals:
                    self._originals[(m, a)] = orig
                    setattr(m, a, wrapper)
            return
        for name in collective_names():
            # in place: all_reduce & co. return None or a Work; their result is the mutated tensor
            buffers = output_buffers(getattr(c10d, name), name)
            self.patch(dist, name, "Distributed", name, inplace=True, buffers=buffers)
            self.patch(c10d, name, "Distributed", name, inplace=True, buffers=buffers)
        self._collective_wrappers = [
            (m, a, self._originals[(m, a)], getattr(m, a))
            for name in collective_names() for m, a in ((dist, name), (c10d, name)) if (m, a) in self._originals]

    def patch_functions(self):
        """Record custom autograd Functions (`_wrap_function_apply`) until `restore()`."""
        from torch.autograd.function import Function
        key = (Function, "apply")
        if key in self._originals:
            return
        orig = Function.__dict__["apply"]
        self._originals[key] = orig
        wrapper = self._wrappers.get(key)
        if wrapper is None:
            wrapper = self._wrappers[key] = _wrap_function_apply(orig)
        setattr(Function, "apply", wrapper)

    def patch_compiled_functions(self):
        """Record custom autograd Functions inside compiled graphs (capture/compiled_functions.py) until
        `restore()`; a class keeps its wrappers from one start() to the next (Dynamo guards on them)."""
        from msprobe.pytorch.capture.compiled_functions import set_installed, user_functions, wrappers
        for cls in user_functions():
            if (cls, "forward") in self._originals:
                self._compiled_functions = True
                continue
            key = (cls,) + tuple(v.__func__ for k, v in cls.__dict__.items()
                                 if k in ("forward", "backward", "setup_context"))
            made = self._wrappers.get(key)
            if made is None:
                made = self._wrappers[key] = wrappers(cls)
            for attr, wrapper in made.items():
                self._originals[(cls, attr)] = cls.__dict__[attr]
                setattr(cls, attr, wrapper)
            self._compiled_functions = True
        set_installed(self._compiled_functions)

    def restore_collectives(self):
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d
        for key in [k for k in self._originals if k[0] in (dist, c10d)]:
            self.restore(*key)

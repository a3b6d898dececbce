"""L2 capture: a TorchDispatchMode that records every aten operator call as `Aten.{op}.{overload}.{n}.forward`.

Below autograd: the aten ops an API decomposes into are recorded, and during backward the aten ops
autograd runs (mm, threshold_backward, ...) appear as calls of their own, in execution order. Each
record's parent in construct.json is the public API that issued it (tracked by ApiCapture, which at L2
records nothing itself), or null for ops run by autograd. The handler runs with the mode popped, so
msprobe's own statistics are not captured.
"""

from torch.utils._python_dispatch import TorchDispatchMode

from msprobe.pytorch import _state
from msprobe.pytorch.capture.recompute import recomputing


def _is_inplace(func):
    return any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)


class AtenCapture(TorchDispatchMode):
    """Records aten calls into `_state.session` while entered."""

    def __init__(self):
        super().__init__()
        self._inplace = {}  # OpOverload -> writes to an argument

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        session = _state.session
        if session is None or _state.busy or recomputing():
            return func(*args, **kwargs)
        inplace = self._inplace.get(func)
        if inplace is None:
            inplace = self._inplace[func] = _is_inplace(func)
        return session.record_aten(func.__name__, func, args, kwargs, inplace)

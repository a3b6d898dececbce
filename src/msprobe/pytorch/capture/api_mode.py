"""L1 capture: a TorchFunctionMode that records every public torch / functional / Tensor API call.

The handler runs with the mode popped, so calls made inside a captured API are not seen (nested calls
fold for free). No attribute of torch is patched. Guarded by benchmarks/dump_overhead.py.
"""

from torch.overrides import TorchFunctionMode

from msprobe.pytorch import _state
from msprobe.pytorch.capture.api_table import build_api_table, is_inplace
from msprobe.pytorch.capture.operator_names import OPERATOR_METHODS, operator_name


class ApiCapture(TorchFunctionMode):
    """Records API calls into `_state.session` while entered (start() enters, stop() exits)."""

    def __init__(self):
        super().__init__()
        table = build_api_table()
        # func -> (prefix, name, inplace), resolved once so the hot path is one dict lookup.
        self._table = {f: (p, n, is_inplace(n), p == "Tensor" and n in OPERATOR_METHODS)
                       for f, (p, n) in table.items()}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs is None:
            kwargs = {}
        info = self._table.get(func)
        session = _state.session
        if info is None or session is None or _state.busy or _state.depth:
            return func(*args, **kwargs)
        prefix, name, inplace, maybe_operator = info
        if maybe_operator:
            name = operator_name(2) or name
            inplace = is_inplace(name)
        return session.record_call(prefix, name, func, args, kwargs, inplace=inplace or "out" in kwargs)

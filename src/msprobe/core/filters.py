"""Which calls get recorded: `scope`, `list`, `data_mode`, `tensor_list` (msprobe-facts §2.2).

The decision is made once per call, at forward time. A `list` entry matching the forward key (or an
enclosing module) selects the call's forward and backward records; an entry matching only the backward
key (`Functional.linear.0.backward`) selects the backward record alone (`wants_forward` is False).
Must not import torch or mindspore.
"""

from msprobe.core.naming import backward_of, is_module_key


class DumpFilter:
    """Stateful filter for one step (the scope window opens and closes in execution order).

    Args:
        cfg: the validated DumpConfig.
    """

    def __init__(self, cfg):
        self.list = tuple(cfg.list)
        self.scope = tuple(cfg.scope)
        self.tensor_list = tuple(cfg.tensor_list)
        modes = set(cfg.data_mode)
        every = "all" in modes
        self.forward = every or "forward" in modes or not modes & {"forward", "backward"}
        self.backward = every or "backward" in modes or not modes & {"forward", "backward"}
        self.input = every or "input" in modes or not modes & {"input", "output"}
        self.output = every or "output" in modes or not modes & {"input", "output"}
        self.saves_all_tensors = cfg.task == "tensor"
        self._scope_open = False
        self._scope_done = False
        self._end_seen = False
        self.hit = False  # some call passed (the debugger says when `scope`/`list` matched nothing)
        self.passes_everything = not self.list and not self.scope

    def reset(self):
        self._scope_open = False
        self._scope_done = False
        self._end_seen = False

    def want_call(self, key, enclosing=()):
        """Record the call whose forward key is `key`? `enclosing` holds the keys of enclosing modules.

        Listed module names (mix) select every call inside that module's span.
        """
        if self.passes_everything:
            self.hit = True
            return True
        if self.scope and not self._in_scope(key, enclosing):
            return False
        if self.list and not (self.wants_forward(key, enclosing) or self._backward_listed(key, enclosing)):
            return False
        self.hit = True
        return True

    def wants_forward(self, key, enclosing=()):
        """Is the forward record of a call `want_call` accepted selected too? False when `list` names
        only its backward key."""
        if not self.list:
            return True
        return _matches(key, self.list) or any(_matches(m, self.list) for m in enclosing)

    def _backward_listed(self, key, enclosing):
        return _matches(backward_of(key), self.list) or any(_matches(backward_of(m), self.list) for m in enclosing)

    def _in_scope(self, key, enclosing):
        start, end = self.scope
        if self._scope_done:
            return False
        if not self._scope_open and (key == start or key.startswith(start + ".")):
            self._scope_open = True
        if not self._scope_open:
            return False
        if self._end_seen:  # an end module keeps the calls inside its span
            if end in enclosing:
                return True
            self._scope_done = True
            return False
        if key == end or key.startswith(end + "."):
            if is_module_key(end):
                self._end_seen = True
            else:
                self._scope_done = True
        return True

    def saves_tensor(self, key):
        return self.saves_all_tensors or (bool(self.tensor_list) and _matches(key, self.tensor_list))


def _matches(key, items):
    return any(item in key for item in items)

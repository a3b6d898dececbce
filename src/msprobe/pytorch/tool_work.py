"""`tool_work`: marks msprobe's own torch calls (statistics, records, hooks) so that capture ignores
them, and runs them without `__torch_function__` handling.

Hooks run outside the L1 mode's handler (backward hooks, module hooks at mix, gradient hooks,
patched collectives): with the mode on the stack every tensor method and property msprobe reads
(`numel()`, `.dtype`, `data_ptr()` ...) would go through its Python handler only to be passed on,
several times the cost of the reads themselves. `DisableTorchFunction` skips that (and any subclass's
handler: msprobe reads what the tensor holds).
"""

from torch._C import DisableTorchFunction

from msprobe.pytorch import _state


class tool_work:
    """Context manager: `_state.busy` set and torch-function handling off for its body (a class:
    cheaper than a generator on the hot path)."""

    __slots__ = ("prev", "guard")

    def __enter__(self):
        self.prev, _state.busy = _state.busy, True
        self.guard = DisableTorchFunction()
        self.guard.__enter__()

    def __exit__(self, *exc):
        self.guard.__exit__(None, None, None)
        _state.busy = self.prev

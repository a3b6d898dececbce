"""`tool_work`: marks msprobe's own torch ops (statistics, hooks) so that capture ignores them."""

from msprobe.pytorch import _state


class tool_work:
    """Context manager setting `_state.busy` for its body (a class: cheaper than a generator on the hot path)."""

    __slots__ = ("prev",)

    def __enter__(self):
        self.prev, _state.busy = _state.busy, True

    def __exit__(self, *exc):
        _state.busy = self.prev

"""`tool_work`: marks msprobe's own MindSpore ops (statistics, hooks) so that capture ignores them."""

from msprobe.mindspore import _state


class tool_work:
    """Context manager setting `_state.busy` for its body (a class: cheaper than a generator)."""

    __slots__ = ("prev",)

    def __enter__(self):
        self.prev, _state.busy = _state.busy, True

    def __exit__(self, *exc):
        _state.busy = self.prev

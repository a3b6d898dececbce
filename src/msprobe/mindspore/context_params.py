"""Reads of MindSpore's context settings on the per-step path.

`mindspore.get_context` validates the key against the device target on every call (~25-45 µs); a
dumped step asked it half a dozen times. Here a setting is read from the context object directly
(~2 µs), the value `get_context` would return; where that interface is gone, through `get_context`.
"""

import mindspore as ms


def _param_reader(name):
    try:
        from mindspore._c_expression import ms_ctx_param
        context, param = ms.context._context(), ms_ctx_param.__members__[name]
        context.get_param(param)
    except (ImportError, AttributeError, KeyError, RuntimeError, TypeError):
        return lambda: ms.get_context(name)
    return lambda: context.get_param(param)


device_target = _param_reader("device_target")
synchronous = _param_reader("pynative_synchronize")
_mode = _param_reader("mode")


def graph_mode():
    """Whether MindSpore runs in GRAPH_MODE (static graph) now."""
    return _mode() == ms.GRAPH_MODE

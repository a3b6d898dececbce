"""SynchronousOps: MindSpore's `pynative_synchronize` on while msprobe captures on a CPU target.

Every recorded call waits for its op to finish: its statistics read the output, and the
`ops.HookBackward` that carries its gradients infers shapes in Python (capture/backward.py). In the
default asynchronous pipeline each such wait is a hand-off from the Python thread to MindSpore's queue
threads and back; with more runnable threads than cores (2 here), every hand-off waits for a core.
Run synchronously, the ops of the step execute on the Python thread in the same order, with the same
kernels and results, and the waits cost nothing (benchmarks/ms_dump_overhead.py, transformer stat_L1:
~210 ms a step asynchronous, ~153 ms synchronous, ~135-155 ms without the tool either way).

Only on the CPU target: on an accelerator the asynchronous launch also overlaps the device with the
host, which synchronous execution would give up for every op, not just the recorded ones. The
user's own setting is put back when capture stops.

The option is set the way `mindspore.set_context(pynative_synchronize=...)` sets it, minus the
deprecation warning that call logs every time (its replacement, `mindspore.runtime.launch_blocking()`,
cannot be switched off again). Where that way is gone, capture simply stays asynchronous.
"""

import mindspore as ms

_OPTION = "pynative_synchronize"


def _option_setter():
    try:
        from mindspore._c_expression import ms_ctx_param
        context, param = ms.context._context(), ms_ctx_param.__members__[_OPTION]
    except (ImportError, AttributeError, KeyError):
        return None
    return lambda on: context.set_param(param, on)


_set_option = _option_setter()


class SynchronousOps:
    """enter() switches synchronous execution on (CPU target, PyNative), exit() restores the setting."""

    __slots__ = ("_saved",)

    def __init__(self):
        self._saved = None  # the user's value while we hold it

    def enter(self):
        if self._saved is not None or _set_option is None or ms.get_context("device_target") != "CPU":
            return
        saved = bool(ms.get_context(_OPTION))
        if not saved:
            _set_option(True)
        self._saved = saved

    def exit(self):
        if self._saved is None:
            return
        saved, self._saved = self._saved, None
        if not saved:
            _set_option(False)

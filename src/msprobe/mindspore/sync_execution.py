"""SynchronousOps: while msprobe captures on a CPU target, MindSpore's ops run on the Python thread —
`pynative_synchronize` on and the frontend and bprop queues bypassed.

Every recorded call waits for its op to finish: its statistics read the output, and the
`ops.HookBackward` that carries its gradients infers shapes in Python (capture/backward.py). In the
default asynchronous pipeline each such wait is a hand-off from the Python thread to MindSpore's queue
threads and back, and those threads spin while they wait: with more runnable threads than cores (2
here), every hand-off waits for a core. Run synchronously, the ops of the step execute in the same
order, with the same kernels and results.

`pynative_synchronize` alone does little once the process has run an op: the queue threads exist from
the first op on. Bypassing the frontend and bprop queues is what MindSpore's own `saved_tensors_hooks`
does for its Python hooks (the same executor call, and the same "was it off already" answer kept for
the way back). The measurements behind this are in benchmarks/RESULTS.md (MindSpore design notes).

Only on the CPU target: on an accelerator the asynchronous launch also overlaps the device with the
host, which synchronous execution would give up for every op, not just the recorded ones. The
user's own settings are put back when capture stops.

The option is set the way `mindspore.set_context(pynative_synchronize=...)` sets it, minus the
deprecation warning that call logs every time (its replacement, `mindspore.runtime.launch_blocking()`,
cannot be switched off again). Where either way is gone, that part simply stays asynchronous.
"""

import mindspore as ms

from msprobe.mindspore import context_params

_OPTION = "pynative_synchronize"


def _option_setter():
    try:
        from mindspore._c_expression import ms_ctx_param
        context, param = ms.context._context(), ms_ctx_param.__members__[_OPTION]
    except (ImportError, AttributeError, KeyError):
        return None
    return lambda on: context.set_param(param, on)


_set_option = _option_setter()
_executor = getattr(getattr(ms.common, "api", None), "_pynative_executor", None)
_bypass_queues = getattr(_executor, "disable_frontend_and_bprop_pipeline", None)
_restore_queues = getattr(_executor, "enable_frontend_and_bprop_pipeline", None)


class SynchronousOps:
    """enter() switches synchronous execution on (CPU target, PyNative), exit() restores the settings."""

    __slots__ = ("_saved", "_queues_were_off")

    def __init__(self):
        self._saved = None  # the user's value while we hold it
        self._queues_were_off = True  # nothing to restore

    def enter(self):
        if self._saved is not None or context_params.device_target() != "CPU":
            return
        saved = bool(context_params.synchronous())
        if not saved and _set_option is not None:
            _set_option(True)
        self._saved = saved
        self._queues_were_off = bool(_bypass_queues()) if _bypass_queues is not None else True

    @staticmethod
    def synchronous():
        """Whether MindSpore runs ops synchronously now (this capture's doing or the user's setting)."""
        return bool(context_params.synchronous())

    def exit(self):
        if self._saved is None:
            return
        saved, self._saved = self._saved, None
        if not saved and _set_option is not None:
            _set_option(False)
        if not self._queues_were_off and _restore_queues is not None:
            _restore_queues()
        self._queues_were_off = True

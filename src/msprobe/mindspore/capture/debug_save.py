"""Single-point save (level debug): MindSpore's side of core/dump/debug_save.py. Every floating tensor of
the variable is hooked; one that no gradient reaches is null in the record."""

import mindspore as ms

from msprobe.core.dump import debug_save
from msprobe.mindspore.capture.backward import grad_recording
from msprobe.mindspore.tool_work import tool_work

_FLOATS = (ms.float16, ms.float32, ms.float64, ms.bfloat16)
_OPS = debug_save.SaveOps(ms.Tensor, hooked=lambda t: t.dtype in _FLOATS, kept=lambda g: g,
                          recording=grad_recording, work=tool_work)


def save_variable(session, variable, name, count, save_backward):
    debug_save.save_variable(session, variable, name, count, save_backward, _OPS)

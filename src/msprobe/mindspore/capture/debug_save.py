"""Single-point save (level debug): `debugger.save(variable, name)` -> `{name}.{n}.debug` in debug.json,
and with save_backward the gradients of its tensors as `{name}_grad.{n}.debug`.

MindSpore gradients are reached through the variable's tensors: `save` returns nothing, so the
gradient hook goes on the tensors themselves (Tensor.register_hook), which then see their total
gradient — the same thing PyTorch's tensor hooks give.
"""

import mindspore as ms

from msprobe.core import naming
from msprobe.core.dump.grad_slots import fill_grads, index_tensors
from msprobe.mindspore import _state
from msprobe.mindspore.capture.backward import grad_recording


def save_variable(session, variable, name, count, save_backward):
    key = naming.debug_key(name, count)
    save = session.filter.saves_tensor(key)
    waits = []
    prev, _state.busy = _state.busy, True
    try:
        record = session.value_record(variable, key, save, waits)
        session.emit(key, record, waits)
        if save_backward and grad_recording():
            _GradSave.attach(session, variable, naming.debug_key(name, count, grad=True), save)
    finally:
        _state.busy = prev


class _GradSave:
    """Tensor hooks on every float tensor of a saved variable; one record once all gradients arrived
    (or at step end, with null for those that never did)."""

    def __init__(self, session, key, structure, save, n):
        self.session, self.key, self.structure, self.save = session, key, structure, save
        self.grads = {}
        self.left = n

    @classmethod
    def attach(cls, session, variable, key, save):
        structure, slots = index_tensors(variable, ms.Tensor)
        slots = [(path, t) for path, t in slots if t.dtype in (ms.float16, ms.float32, ms.float64, ms.bfloat16)]
        if not slots:
            return
        me = cls(session, key, structure, save, len(slots))
        for path, t in slots:
            t.register_hook(me._hook(path))
        session.trackers[me] = None

    def _hook(self, path):
        def on_grad(grad):
            if self.session is None:
                return None
            self.grads[path] = grad
            self.left -= 1
            if self.left == 0:
                self._emit()
            return None
        return on_grad

    def _emit(self):
        session, self.session = self.session, None
        session.trackers.pop(self, None)
        waits = []
        prev, _state.busy = _state.busy, True
        try:
            record = fill_grads(self.structure, self.grads, session, self.key, self.save, waits)
            session.emit(self.key, record, waits)
        finally:
            _state.busy = prev

    def emit_partial(self):
        if self.session is not None and self.grads:
            self._emit()
        self.session = None

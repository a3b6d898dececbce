"""Single-point save (level debug): `debugger.save(variable, name)` -> `{name}.{n}.debug` in debug.json,
and with save_backward the gradients of its tensors as `{name}_grad.{n}.debug`.

MindSpore gradients are reached through the variable's tensors: `save` returns nothing, so the
gradient hook goes on the tensors themselves (Tensor.register_hook), which then see their total
gradient — the same thing PyTorch's tensor hooks give.
"""

import mindspore as ms

from msprobe.core import naming
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
        slots = []
        structure = _index(variable, (), slots)
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
            record = _fill(self.structure, self.grads, session, self.key, self.save, waits)
            session.emit(self.key, record, waits)
        finally:
            _state.busy = prev

    def emit_partial(self):
        if self.session is not None and self.grads:
            self._emit()
        self.session = None


def _index(v, path, slots):
    """Replace each tensor in `v` by its index path (and collect it); keep the container shape."""
    if isinstance(v, ms.Tensor):
        slots.append((path, v))
        return ("__tensor__", path)
    if isinstance(v, (list, tuple)):
        return [_index(x, path + (i,), slots) for i, x in enumerate(v)]
    if isinstance(v, dict):
        return {str(k): _index(x, path + (str(k),), slots) for k, x in v.items()}
    return None


def _fill(structure, grads, session, key, save, waits):
    if isinstance(structure, tuple) and structure and structure[0] == "__tensor__":
        g = grads.get(structure[1])
        if g is None:
            return None
        stem = naming.debug_file_name(key, structure[1], "")
        return session.tensor_record(g, stem, save, waits)
    if isinstance(structure, list):
        return [_fill(x, grads, session, key, save, waits) for x in structure]
    if isinstance(structure, dict):
        return {k: _fill(x, grads, session, key, save, waits) for k, x in structure.items()}
    return None

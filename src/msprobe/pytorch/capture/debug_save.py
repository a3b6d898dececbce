"""Single-point save (level debug): `debugger.save(variable, name)` -> `{name}.{n}.debug` in debug.json,
and with save_backward the gradients of its tensors as `{name}_grad.{n}.debug`."""

import torch

from msprobe.core import naming
from msprobe.core.dump.grad_slots import fill_grads, index_tensors
from msprobe.pytorch.tool_work import tool_work


def save_variable(session, variable, name, count, save_backward):
    key = naming.debug_key(name, count)
    save = session.filter.saves_tensor(key)
    waits = []
    with tool_work():
        record = session.value_record(variable, key, save, waits)
        session.emit(key, record, waits)
        if save_backward and torch.is_grad_enabled():
            _GradSave.attach(session, variable, naming.debug_key(name, count, grad=True), save)


class _GradSave:
    """Tensor hooks on every tensor of a saved variable; one record once all gradients arrived
    (or at step end, with null for those that never did)."""

    def __init__(self, session, key, structure, save, n):
        self.session, self.key, self.structure, self.save = session, key, structure, save
        self.grads = {}
        self.left = n

    @classmethod
    def attach(cls, session, variable, key, save):
        structure, slots = index_tensors(variable, torch.Tensor)
        slots = [(path, t) for path, t in slots if t.requires_grad]
        if not slots:
            return
        me = cls(session, key, structure, save, len(slots))
        for path, t in slots:
            t.register_hook(me._hook(path))
        session.trackers[me] = None

    def _hook(self, path):
        def on_grad(grad):
            if self.session is None:
                return
            self.grads[path] = grad.detach().clone()
            self.left -= 1
            if self.left == 0:
                self._emit()
        return on_grad

    def _emit(self):
        session, self.session = self.session, None
        session.trackers.pop(self, None)
        waits = []
        with tool_work():
            record = fill_grads(self.structure, self.grads, session, self.key, self.save, waits)
            session.emit(self.key, record, waits)

    def emit_partial(self):
        if self.session is not None:
            self._emit()

"""Single-point save (level debug) for both adapters: `debugger.save(variable, name)` -> `{name}.{n}.debug` in
debug.json and, with save_backward, the gradients of its tensors as `{name}_grad.{n}.debug`, rebuilt in the
variable's shape once they arrive (null for a tensor whose gradient never came by the step's end).

`save` returns nothing, so the gradients are reached through the variable's tensors: a tensor hook on each,
which sees its total gradient in either framework. The adapter hands in a `SaveOps` for what differs.
"""

from msprobe.core import naming

_TENSOR = "__tensor__"


class SaveOps:
    """What `save_variable` asks of a framework.

    Args:
        tensor_type: the framework's tensor class.
        hooked: tensor -> whether it takes a gradient hook (one that may see a gradient).
        kept: gradient -> what is held until the record is made (a copy where the caller may change it).
        recording: () -> whether the forward pass running now records gradients.
        work: context-manager class marking msprobe's own work (its tensor reads are not captured).
    """

    __slots__ = ("tensor_type", "hooked", "kept", "recording", "work")

    def __init__(self, tensor_type, hooked, kept, recording, work):
        self.tensor_type, self.hooked, self.kept, self.recording, self.work = tensor_type, hooked, kept, recording, work


def save_variable(session, variable, name, count, save_backward, ops):
    """The `{name}.{count}.debug` record of `variable`, and its gradients' record when `save_backward`."""
    key = naming.debug_key(name, count)
    save = session.filter.saves_tensor(key)
    waits = []
    with ops.work():
        record = session.value_record(variable, key, save, waits)
        session.emit(key, record, waits)
        if save_backward and ops.recording():
            GradSave.attach(session, variable, naming.debug_key(name, count, grad=True), save, ops)


class GradSave:
    """Tensor hooks on the tensors of a saved variable; one record once all gradients arrived (or at the step's
    end, `emit_partial`, with null for those that never did). Waits among the session's trackers."""

    def __init__(self, session, key, structure, save, n, ops):
        self.session, self.key, self.structure, self.save, self.ops = session, key, structure, save, ops
        self.grads = {}
        self.left = n

    @classmethod
    def attach(cls, session, variable, key, save, ops):
        structure, slots = index_tensors(variable, ops.tensor_type)
        slots = [(path, t) for path, t in slots if ops.hooked(t)]
        if not slots:
            return
        me = cls(session, key, structure, save, len(slots), ops)
        for path, t in slots:
            t.register_hook(me._hook(path))
        session.trackers[me] = None

    def _hook(self, path):
        def on_grad(grad):
            if self.session is None:
                return None
            self.grads[path] = self.ops.kept(grad)
            self.left -= 1
            if self.left == 0:
                self._emit()
            return None  # the gradient passes on unchanged
        return on_grad

    def _emit(self):
        session, self.session = self.session, None
        session.trackers.pop(self, None)
        waits = []
        with self.ops.work():
            record = fill_grads(self.structure, self.grads, session, self.key, self.save, waits)
            session.emit(self.key, record, waits)

    def emit_partial(self):
        if self.session is not None:
            self._emit()


def index_tensors(v, tensor_type, path=(), slots=None):
    """(structure, slots): `v` with each tensor replaced by its index path; slots = [(path, tensor)]."""
    slots = [] if slots is None else slots
    if isinstance(v, tensor_type):
        slots.append((path, v))
        return (_TENSOR, path), slots
    if isinstance(v, (list, tuple)):
        return [index_tensors(x, tensor_type, path + (i,), slots)[0] for i, x in enumerate(v)], slots
    if isinstance(v, dict):
        return {str(k): index_tensors(x, tensor_type, path + (str(k),), slots)[0] for k, x in v.items()}, slots
    return None, slots


def fill_grads(structure, grads, session, key, save, waits):
    """The gradient record in `structure`'s shape: a tensor record per arrived gradient, null otherwise."""
    if isinstance(structure, tuple) and structure and structure[0] == _TENSOR:
        g = grads.get(structure[1])
        if g is None:
            return None
        return session.tensor_record(g, naming.debug_file_name(key, structure[1], ""), save, waits)
    if isinstance(structure, list):
        return [fill_grads(x, grads, session, key, save, waits) for x in structure]
    if isinstance(structure, dict):
        return {k: fill_grads(x, grads, session, key, save, waits) for k, x in structure.items()}
    return None

"""For `save(variable, name, save_backward=True)` in both adapters: the tensors of a saved variable as
index paths, and the gradient record rebuilt in the variable's shape once gradients arrive."""

from msprobe.core import naming

_TENSOR = "__tensor__"


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

"""What a monitor's `targets` spec picks out of a hook argument (a tensor, or a tuple/list of values),
and the names the picked tensors are recorded under.

Must not import torch or mindspore: the callers pass their framework's tensor type.
"""


def hook_tensors(value, tensor_type):
    """The tensors of a hook argument: a tensor, or the tensors in a tuple/list (in order)."""
    if isinstance(value, tensor_type):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, tensor_type)]
    return []


def select(value, index, tensor_type):
    """Apply a targets spec: None = every tensor, i = element i of the tuple."""
    if index is None:
        return hook_tensors(value, tensor_type)
    if isinstance(value, (tuple, list)) and index < len(value) and isinstance(value[index], tensor_type):
        return [value[index]]
    return []


def named(base, tensors):
    """(name, tensor) pairs: `base` for a single tensor, `base.{i}` for each of several."""
    if len(tensors) == 1:
        return [(base, tensors[0])]
    return [(f"{base}.{i}", t) for i, t in enumerate(tensors)]

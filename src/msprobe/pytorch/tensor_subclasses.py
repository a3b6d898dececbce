"""Tensor subclasses of distributed training whose memory is not their own, as plain tensors to summarise.

- DTensor (FSDP2 parameters and gradients, tensor-parallel activations): the rank's own shard
  (`_local_tensor`: no autograd op, no collective) and a `shard` field that says which part of the whole
  tensor it is: `{"placements": ["Shard(0)"], "mesh": [0, 1], "coordinate": [1], "local_shape": [...],
  "offset": [...]}`; the record keeps the whole tensor's shape. core/compare/shards.py merges the
  records of all ranks from these fields.
- AsyncCollectiveTensor (functional collectives, e.g. a tensor-parallel output): the collective's
  result, waited for as the program's next use of it would.
Nothing here gathers or starts a collective.
"""

import functools
import sys


def _distributed_types():
    """(DTensor, AsyncCollectiveTensor), or None while the program has not imported DTensor (then none
    exists; importing it here would pull sympy into every dump)."""
    if "torch.distributed.tensor" not in sys.modules:
        return None
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import DTensor
    return DTensor, AsyncCollectiveTensor


def placement_name(p):
    """'Shard(0)', 'Replicate', 'Partial(sum)' (a strided shard is a 'Shard(d)': its offset says where)."""
    if p.is_shard():
        return f"Shard({p.dim})"
    if p.is_replicate():
        return "Replicate"
    if p.is_partial():
        return f"Partial({getattr(p, 'reduce_op', 'sum')})"
    return str(p)


@functools.lru_cache(maxsize=1024)  # a handful of (shape, mesh, placements) per model
def _layout(shape, mesh, placements):
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    local_shape, offset = compute_local_shape_and_global_offset(shape, mesh, placements)
    return {"placements": [placement_name(p) for p in placements],
            "mesh": mesh.mesh.flatten().tolist(),
            "coordinate": list(mesh.get_coordinate() or ()),
            "local_shape": list(local_shape), "offset": list(offset)}


def is_dtensor(t):
    """Whether `t` is a DTensor, asked of its type's name: no import, and Dynamo reads it as a constant where it
    traces msprobe's record sites (capture/compiled.py)."""
    kind = type(t)
    return kind.__name__ == "DTensor" and kind.__module__.startswith("torch.distributed.tensor")


def plain_tensor(t):
    """(a plain tensor holding `t`'s local values, the `shard` field of a DTensor or None)."""
    types = _distributed_types()
    if types is None:
        return t, None
    DTensor, AsyncCollectiveTensor = types
    if isinstance(t, DTensor):
        spec = t._spec
        local, shard = t._local_tensor, dict(_layout(tuple(t.shape), spec.mesh, tuple(spec.placements)))
        return plain_tensor(local)[0], shard
    if isinstance(t, AsyncCollectiveTensor):
        return t.trigger_wait(), None
    return t, None

"""What an API call needs to be re-run, read from its dump records: argument specs and API cases.

A dump record's `input_args` / `input_kwargs` become a tree of the same shape (lists, dicts) whose
leaves are `TensorSpec` (dtype, shape, Max/Min, requires_grad, data_name), `ValueSpec` (a restored
int/float/bool/str/slice/ellipsis/dtype/device/Size) or None. Which framework object a ValueSpec turns
into is the executor's business. Must not import torch or mindspore.
"""

import math
from dataclasses import dataclass
from typing import Optional

from msprobe.core.acc_check.dtypes import canonical_dtype
from msprobe.core.dump.reader import stat_value
from msprobe.core.naming import BACKWARD, FORWARD, is_module_key, split_key

# Non-tensor argument types that carry their whole value in the record.
RESTORABLE_TYPES = frozenset({"int", "float", "bool", "str", "slice", "ellipsis", "torch.Size", "torch.dtype",
                              "torch.device", "torch.memory_format", "complex", "mindspore.dtype",
                              "mindspore.common.dtype.Type", "tuple", "list"})
COMMUNICATION_TYPES = frozenset({"torch.ProcessGroup", "torch.distributed.ReduceOp"})
COMMUNICATION_PREFIXES = frozenset({"Distributed", "MintDistributed", "NPUDistributed"})


class UnsupportedArgument(Exception):
    """An argument the record does not describe well enough to rebuild (the API is skipped)."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument, output or gradient as the dump describes it."""

    dtype: str  # canonical: 'float32', 'bfloat16', 'int64', 'bool', ...
    dtype_name: str  # as the dump wrote it: 'torch.float32' or 'Float32'
    shape: tuple
    max: object
    min: object
    requires_grad: Optional[bool]
    data_name: Optional[str]

    @property
    def numel(self):
        return math.prod(self.shape)


@dataclass(frozen=True)
class ValueSpec:
    """A non-tensor argument with its value restored from the record."""

    type_name: str
    value: object


def tensor_spec(record):
    dtype = canonical_dtype(record.get("dtype"))
    if dtype is None:
        raise UnsupportedArgument(f"tensor dtype {record.get('dtype')!r} is not supported")
    shape = record.get("shape")
    if not isinstance(shape, (list, tuple)) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise UnsupportedArgument(f"tensor shape {shape!r} is not a list of sizes")
    return TensorSpec(dtype, str(record.get("dtype")), tuple(shape), stat_value(record.get("Max")),
                      stat_value(record.get("Min")), record.get("requires_grad"), record.get("data_name"))


def spec_tree(value):
    """Spec tree of one recorded argument/output (list, dict, tensor record, value record or None)."""
    if value is None:
        return None
    if isinstance(value, list):
        return [spec_tree(v) for v in value]
    if not isinstance(value, dict):
        raise UnsupportedArgument(f"record entry {value!r:.60} is neither a value nor a tensor record")
    if "type" in value and "dtype" in value and "shape" in value:
        return tensor_spec(value)
    type_name = value.get("type")
    if type_name is None:  # a recorded dict argument: {name: record}
        return {k: spec_tree(v) for k, v in value.items()}
    if type_name in COMMUNICATION_TYPES:
        raise UnsupportedArgument(f"argument of type {type_name} (a communication op)")
    if type_name not in RESTORABLE_TYPES or ("value" not in value and type_name != "ellipsis"):
        raise UnsupportedArgument(f"argument of type {type_name} cannot be rebuilt from the dump")
    return ValueSpec(type_name, value.get("value"))


def iter_tensor_specs(tree, path=()):
    """(index path, TensorSpec) for every tensor in a spec tree, args before kwargs, in order."""
    if isinstance(tree, TensorSpec):
        yield path, tree
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from iter_tensor_specs(v, path + (i,))
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from iter_tensor_specs(v, path + (k,))


@dataclass
class ApiCase:
    """One API call of the dump: its forward record and, when the dump has it, its backward record.

    `name` is what the result CSV calls it (`Functional.linear.0`); `prefix` and `api` are the two
    halves of its dump name (`Functional`, `linear`; `Aten`, `add.Tensor`).
    """

    name: str
    prefix: str
    api: str
    forward: dict
    backward: Optional[dict] = None

    def forward_key(self):
        return f"{self.name}.{FORWARD}"

    def backward_key(self):
        return f"{self.name}.{BACKWARD}"


def cases_from_dump(data):
    """ApiCases in dump order from a dump's `data` mapping; modules and debug saves are left out.

    A backward record without its forward record cannot be re-run and is dropped.
    """
    cases = {}
    backwards = {}
    for key, record in data.items():
        if is_module_key(key) or not isinstance(record, dict):
            continue
        base, direction, index = split_key(key)
        if direction not in (FORWARD, BACKWARD) or "." not in base:
            continue
        name = f"{base}.{index}"
        if direction == FORWARD:
            prefix, api = base.split(".", 1)
            cases[name] = ApiCase(name, prefix, api, record)
        else:
            backwards[name] = record
    for name, record in backwards.items():
        if name in cases:
            cases[name].backward = record
    return list(cases.values())


def is_finite_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def forward_inputs(case):
    """(spec tree [args, kwargs], [(key, TensorSpec)]) of a case's forward call.

    Keys name tensors like tensor files do: `forward.input.0`, `forward.input.weight`, `forward.input.1.0`.

    Raises:
        UnsupportedArgument: an argument cannot be rebuilt.
    """
    fwd = case.forward
    tree = spec_tree([fwd.get("input_args") or [], fwd.get("input_kwargs") or {}])
    tensors = [("forward.input." + ".".join(str(p) for p in path[1:]), spec) for path, spec in iter_tensor_specs(tree)]
    return tree, tensors


def gradient_inputs(case, tensors, float_kinds=("float", "complex")):
    """Indexes (into `tensors`) of the inputs whose gradient the backward record holds.

    The backward record's `output` lists one entry per tensor input (null where there is no gradient);
    without such a list, floating inputs with requires_grad (or no requires_grad field) are taken.
    """
    from msprobe.core.acc_check.dtypes import kind
    recorded = case.backward.get("output") if case.backward else None
    picked = []
    for i, (_, spec) in enumerate(tensors):
        if kind(spec.dtype) not in float_kinds:
            continue
        if isinstance(recorded, list) and len(recorded) == len(tensors):
            if recorded[i] is not None:
                picked.append(i)
        elif spec.requires_grad or spec.requires_grad is None:
            picked.append(i)
    return picked


def output_gradient_specs(case):
    """The backward record's gradients of the outputs, one entry per output position (None = none)."""
    if not case.backward:
        return []
    out = []
    try:
        _leaves_into(spec_tree(case.backward.get("input") or []), out)
    except UnsupportedArgument:
        return []
    return [s if isinstance(s, TensorSpec) else None for s in out]


def _leaves_into(node, out):
    if isinstance(node, list):
        for v in node:
            _leaves_into(v, out)
    else:
        out.append(node)


def build_call(tree, leaves, python_value):
    """(args list, kwargs dict) of a call from its spec `tree`: a TensorSpec becomes `leaves[id(spec)]`,
    a ValueSpec `python_value(spec)`, a list a tuple.

    Plain recursion on purpose: a recursive closure is a reference cycle (function -> cell -> function)
    that would keep every API's built inputs alive until the cyclic collector runs.
    """
    args, kwargs = tree
    return ([_built(v, leaves, python_value) for v in args],
            {k: _built(v, leaves, python_value) for k, v in kwargs.items()})


def _built(node, leaves, python_value):
    if isinstance(node, TensorSpec):
        return leaves[id(node)]
    if isinstance(node, ValueSpec):
        return python_value(node)
    if isinstance(node, list):
        return tuple(_built(v, leaves, python_value) for v in node)
    if isinstance(node, dict):
        return {k: _built(v, leaves, python_value) for k, v in node.items()}
    return node

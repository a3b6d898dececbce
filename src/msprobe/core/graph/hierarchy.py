"""The model hierarchy of one rank directory: modules and APIs as a tree, in execution order.

Built from construct.json (node -> enclosing module), dump.json (records, their order) and
stack.json (call stacks). Works on our dumps and msProbe's, PyTorch (`Module`) and MindSpore (`Cell`).
Must not import torch or mindspore.
"""

import math
import os
from dataclasses import dataclass, field

from msprobe.core.dump.reader import DumpReader, iter_tensor_records, stat_value
from msprobe.core.errors import MsprobeError
from msprobe.core.naming import is_module_key, split_key

# Node kinds shown by the viewer.
MODULE, API, PARAMS_GRAD, SCOPE = "module", "api", "params_grad", "scope"
STAT_FIELDS = ("Max", "Min", "Mean", "Norm")


@dataclass
class GraphNode:
    """One module call, API call, parameter-gradient record or a scope without a record (`optimizer`)."""

    name: str
    kind: str
    parent: str = None
    children: list = field(default_factory=list)
    record: dict = None  # the dump.json record, None when only construct.json knows the node
    order: float = math.inf  # position in execution order (smallest of itself and its subtree)


@dataclass
class ModelGraph:
    """The tree of one step/rank dump.

    Attributes:
        nodes: name -> GraphNode, in execution order (parents before their children).
        roots: names of the top-level nodes, in execution order.
        stacks: name -> list of call-stack lines.
    """

    rank_dir: str
    framework: str
    task: str
    level: str
    nodes: dict
    roots: list
    stacks: dict

    def __len__(self):
        return len(self.nodes)

    def find_node(self, tensor_name):
        """The node a flattened tensor name (`Functional.linear.0.forward.output.0`) belongs to.

        The longest dotted prefix that names a node; None when there is none.
        """
        if not isinstance(tensor_name, str):
            return None
        name = tensor_name
        while name:
            if name in self.nodes:
                return name
            cut = name.rfind(".")
            if cut < 0:
                return None
            name = name[:cut]
        return None


def kind_of(key):
    if is_module_key(key):
        return PARAMS_GRAD if split_key(key)[1] == "parameters_grad" else MODULE
    return API if split_key(key)[1] in ("forward", "backward") else SCOPE


def graph_from_dump(path):
    """Build the hierarchy of one rank directory (or its dump.json).

    Args:
        path: a `step{N}/rank{R}` directory or its dump.json.

    Returns:
        ModelGraph.

    Raises:
        MsprobeError: the dump has no hierarchy (level L1, or construct.json empty/missing).
        DumpFormatError: a file is missing or not valid JSON.
    """
    reader = DumpReader(path)
    construct = reader.construct
    if not construct:
        has_file = os.path.isfile(os.path.join(reader.rank_dir, "construct.json"))
        why = f"its level is {reader.level}" if reader.level == "L1" else \
            ("construct.json is empty" if has_file else "construct.json is missing")
        raise MsprobeError(f"'{reader.rank_dir}': no model hierarchy ({why}); the graph needs a dump "
                           f"at level L0 or mix (set \"level\": \"mix\" in config.json)")
    nodes = {}

    def ensure(name):
        if name not in nodes:
            nodes[name] = GraphNode(name, kind_of(name))
        return nodes[name]

    position = 0
    for key in construct:  # construct.json is written in execution order too
        ensure(key).order = position
        position += 1
    for key, record in reader.items():
        node = ensure(key)
        node.record = record
        node.order = min(node.order, position)
        position += 1
    for key, parent in construct.items():
        if parent:
            ensure(parent)  # a scope like "optimizer" has no record of its own
            nodes[key].parent = parent
    for node in list(nodes.values()):
        if node.kind == PARAMS_GRAD and node.parent is None:
            _attach_params_grad(node, nodes)
    _break_cycles(nodes)
    for node in nodes.values():
        if node.parent is not None:
            nodes[node.parent].children.append(node.name)
    roots = [n.name for n in nodes.values() if n.parent is None]
    for r in roots:
        _settle_order(nodes, r)
    for node in nodes.values():
        node.children.sort(key=lambda c: nodes[c].order)
    roots.sort(key=lambda c: nodes[c].order)
    ordered = {}
    stack = list(reversed(roots))
    while stack:  # pre-order: every parent before its children, siblings in execution order
        name = stack.pop()
        ordered[name] = nodes[name]
        stack.extend(reversed(nodes[name].children))
    return ModelGraph(reader.rank_dir, reader.framework or "", reader.task or "", reader.level or "",
                      ordered, roots, reader.stack)


def _attach_params_grad(node, nodes):
    """`Module.fc.Linear.parameters_grad.0` belongs under `Module.fc.Linear.backward.0` when dumped."""
    base, _, index = split_key(node.name)
    owner = f"{base}.backward.{index}"
    if owner in nodes:
        node.parent = owner


def _break_cycles(nodes):
    """A corrupt construct.json may loop; cut the edge that closes a loop so the tree stays a tree."""
    for node in nodes.values():
        seen, cur = {node.name}, node
        while cur.parent is not None:
            if cur.parent in seen:
                cur.parent = None
                break
            seen.add(cur.parent)
            cur = nodes[cur.parent]


def _settle_order(nodes, root):
    """Give every node the smallest order of its subtree (a module is recorded after its first API)."""
    post, stack = [], [root]
    while stack:
        name = stack.pop()
        post.append(name)
        stack.extend(nodes[name].children)
    for name in reversed(post):
        node = nodes[name]
        for c in node.children:
            node.order = min(node.order, nodes[c].order)


def tensor_entries(key, record):
    """Flattened (name, role, entry) for every tensor or scalar of a record, named as compare names rows.

    role is input/output/parameters/parameters_grad; entry is the tensor record or {"type", "value"}.
    """
    if not isinstance(record, dict):
        return []
    out = []
    direction = split_key(key)[1]
    if direction == "parameters_grad":
        for pname, value in record.items():
            for path, rec in _walk(value):
                out.append((_join(key, pname, *path), "parameters_grad", rec))
        return out
    inputs = record.get("input_args", record.get("input"))
    for role, value in (("input", inputs), ("input", record.get("input_kwargs")),
                        ("output", record.get("output")), ("parameters", record.get("parameters"))):
        for path, rec in _walk(value):
            out.append((_join(key, role, *path), role, rec))
    return out


def _walk(value, path=()):
    if isinstance(value, dict) and "type" in value and "value" in value and "dtype" not in value:
        yield path, value  # a scalar argument
        return
    if isinstance(value, dict) and "type" in value and "dtype" in value:
        yield path, value
        return
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, path + (i,))


def _join(*parts):
    return ".".join(str(p) for p in parts)


def record_overflow(record):
    """Overflow level of a record from its statistics, as in overflow analysis.

    Returns:
        "critical" when an output is inf/nan although every input is finite (this call made it),
        "high" when outputs and inputs are both non-finite (it passed on), "medium" when only inputs
        are non-finite, else None.
    """
    if not isinstance(record, dict):
        return None
    inputs = [record.get("input_args"), record.get("input_kwargs"), record.get("input"), record.get("parameters")]
    bad_in = any(_non_finite(rec) for v in inputs for _, rec in iter_tensor_records(v))
    bad_out = any(_non_finite(rec) for _, rec in iter_tensor_records(record.get("output")))
    if bad_out:
        return "high" if bad_in else "critical"
    return "medium" if bad_in else None


def _non_finite(rec):
    for f in STAT_FIELDS:
        v = stat_value(rec.get(f))
        if isinstance(v, float) and not math.isfinite(v):
            return True
    return False

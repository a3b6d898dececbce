"""The graph document: a compact, columnar JSON form of one or more step/rank graphs.

The viewer page embeds it packed (`packing.py`); `database.py` writes it as SQLite for other tools.
Nodes are listed in pre-order (a parent before its children, siblings in execution order), so a
node's parent always has a smaller index. Per node: name, parent index, kind, verdict, the diagnosis'
label (its rows' most telling Diagnosis), overflow level, golden match, stack index and tensor rows. Must not import torch or mindspore.
"""

import math

from msprobe.core.graph.hierarchy import record_overflow, tensor_entries, STAT_FIELDS
from msprobe.core.graph.merge import NONE, UNMATCHED, VERDICT_NAMES, _cell

FORMAT_VERSION = 1
KINDS = ("module", "api", "params_grad", "scope")
OVERFLOW_LEVELS = (None, "medium", "high", "critical")
# Single-graph rows use the compare table's target-side column names, so the viewer reads both alike.
SINGLE_COLUMNS = ["NPU Name", "NPU Dtype", "NPU Tensor Shape", "NPU max", "NPU min", "NPU mean", "NPU l2norm",
                  "NPU MD5", "Value"]
_GOLDEN_ONLY = {"name": "Bench Name", "dtype": "Bench Dtype", "shape": "Bench Tensor Shape",
                "Max": "Bench max", "Min": "Bench min", "Mean": "Bench mean", "Norm": "Bench l2norm",
                "md5": "BENCH MD5"}


class _Builder:
    """Accumulates the columnar arrays of one graph."""

    def __init__(self, columns):
        self.columns = columns
        self.col = {c: i for i, c in enumerate(columns)}
        self.names, self.parent, self.kind, self.verdict, self.overflow = [], [], [], [], []
        self.match, self.side, self.stack, self.rows = [], [], [], []
        self.diagnosis = []
        self.stacks, self._stack_ids = [], {}
        self.index = {}

    def add(self, name, parent_index, kind, verdict, overflow, match, side, stack_lines, rows, diagnosis=""):
        self.index[(side, name)] = len(self.names)
        self.diagnosis.append(diagnosis)
        self.names.append(name)
        self.parent.append(parent_index)
        self.kind.append(KINDS.index(kind))
        self.verdict.append(verdict)
        self.overflow.append(OVERFLOW_LEVELS.index(overflow))
        self.match.append(match)
        self.side.append(side)
        self.stack.append(self._stack_id(stack_lines))
        self.rows.append(rows or 0)

    def _stack_id(self, lines):
        if not lines:
            return -1
        key = tuple(lines)
        if key not in self._stack_ids:
            self._stack_ids[key] = len(self.stacks)
            self.stacks.append(list(lines))
        return self._stack_ids[key]

    def row_from_entry(self, name, rec, mapping):
        row = [None] * len(self.columns)

        def put(column, value):
            if column in self.col:
                row[self.col[column]] = _cell(value)

        put(mapping["name"], name)
        if "dtype" in rec:
            put(mapping["dtype"], rec.get("dtype"))
            put(mapping["shape"], str(rec.get("shape")))
            for f in STAT_FIELDS:
                put(mapping[f], _stat(rec.get(f)))
            put(mapping["md5"], rec.get("md5"))
        else:
            put("Value", f"{rec.get('type')}: {rec.get('value')!r}")
        return row

    def to_json(self, **meta):
        return dict(meta, columns=self.columns, names=self.names, parent=self.parent, kind=self.kind,
                    verdict=self.verdict, overflow=self.overflow, match=self.match, side=self.side,
                    diagnosis=self.diagnosis,
                    stack=self.stack, stacks=self.stacks, rows=self.rows)


def _stat(v):
    if isinstance(v, str):
        return v  # "inf"/"nan" as written
    if isinstance(v, float) and not math.isfinite(v):
        return _cell(v)
    return v


_TARGET = {"name": "NPU Name", "dtype": "NPU Dtype", "shape": "NPU Tensor Shape", "Max": "NPU max",
           "Min": "NPU min", "Mean": "NPU mean", "Norm": "NPU l2norm", "md5": "NPU MD5"}


def single_graph_json(graph, step, rank, overflow_check=False):
    """The document entry of one graph built without a golden dump."""
    b = _Builder(list(SINGLE_COLUMNS))
    for name, node in graph.nodes.items():
        rows = [b.row_from_entry(n, rec, _TARGET) for n, _, rec in tensor_entries(name, node.record)]
        b.add(name, b.index[(0, node.parent)] if node.parent else -1, node.kind, NONE,
              record_overflow(node.record) if overflow_check else None, None, 0,
              graph.stacks.get(name), rows)
    return b.to_json(step=step, rank=rank, target=graph.rank_dir, golden=None, framework=graph.framework,
                     task=graph.task, level=graph.level, compare_mode=None, overflow_check=overflow_check,
                     start_here=-1, suspects=[])


def compare_graph_json(merged, step, rank, compare_mode, overflow_check=False, suspects=()):
    """The document entry of one compared graph.

    Args:
        merged: MergedGraph from `merge_compare`.
        compare_mode: "tensor", "statistics" or "md5".
        suspects: ranked (tensor or node name, reason) pairs from the diagnosis, for this step/rank.
    """
    target, golden = merged.target, merged.golden
    b = _Builder(list(merged.columns))
    matched = {m for m in merged.match.values() if m is not None}
    golden_children = {}
    for gname, tparent in merged.golden_only:
        golden_children.setdefault(tparent, []).append(gname)

    def add_golden_subtree(gname, parent_index):
        stack = [(gname, parent_index)]
        while stack:
            name, pidx = stack.pop()
            node = golden.nodes[name]
            rows = [b.row_from_entry(n, rec, _GOLDEN_ONLY) for n, _, rec in tensor_entries(name, node.record)]
            for r in rows:
                if "Result" in b.col:
                    r[b.col["Result"]] = "unmatched"
            b.add(name, pidx, node.kind, UNMATCHED, None, name, 1, golden.stacks.get(name), rows, "unmatched")
            me = len(b.names) - 1
            # children matched by a target node are shown there, not twice
            stack.extend((c, me) for c in reversed(node.children) if c not in matched)

    for name in golden_children.get(None, ()):
        add_golden_subtree(name, -1)
    for name, node in target.nodes.items():
        b.add(name, b.index[(0, node.parent)] if node.parent else -1, node.kind, merged.verdict[name],
              record_overflow(node.record) if overflow_check else None, merged.match[name], 0,
              target.stacks.get(name), merged.rows.get(name), merged.diagnosis.get(name, ""))
        for gname in golden_children.get(name, ()):
            add_golden_subtree(gname, b.index[(0, name)])
    ranked = []
    for tensor_name, why in suspects:
        node = target.find_node(tensor_name)
        if node is not None:
            ranked.append({"node": b.index[(0, node)], "name": tensor_name, "why": why})
    return b.to_json(step=step, rank=rank, target=target.rank_dir, golden=golden.rank_dir,
                     framework=target.framework, golden_framework=golden.framework, task=target.task,
                     level=target.level, compare_mode=compare_mode, overflow_check=overflow_check,
                     start_here=ranked[0]["node"] if ranked else -1, suspects=ranked)


def graph_document(graphs, mode, diagnosis=None):
    """The whole document: every step/rank graph plus what the page needs to label them."""
    counts = {}
    for g in graphs:
        for v in g["verdict"]:
            counts[VERDICT_NAMES[v]] = counts.get(VERDICT_NAMES[v], 0) + 1
    return {"format": "msprobe-graph", "version": FORMAT_VERSION, "mode": mode,
            "verdicts": list(VERDICT_NAMES), "kinds": list(KINDS),
            "overflow_levels": [x or "" for x in OVERFLOW_LEVELS], "diagnosis": diagnosis,
            "counts": counts, "graphs": graphs}


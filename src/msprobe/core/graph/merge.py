"""Merge a compare result into the target's hierarchy: rows per node, node verdicts, golden matches.

The verdicts are the compare engine's typed verdicts of each row (the rules live in `core/compare`, not
here), the labels the diagnosis' (`PairDiagnosis.labels`): a node takes the worst verdict of its rows
and their most telling label. Must not import torch or mindspore.
"""

import math
from dataclasses import dataclass, field

from msprobe.core.graph.hierarchy import tensor_entries

# Verdict codes, ordered so that max() is "worst".
NONE, PASS, WARNING, ERROR, UNMATCHED = 0, 1, 2, 3, 4
VERDICT_NAMES = ("none", "pass", "warning", "error", "unmatched")
_SEVERITY = {NONE: 0, PASS: 1, UNMATCHED: 2, WARNING: 3, ERROR: 4}  # for the worst-of rule
_CODES = {"error": ERROR, "warning": WARNING, "pass": PASS}  # N/A and fused away are no verdict
# Columns that the graph keeps elsewhere (stacks) or that only locate files.
_DROPPED_COLUMNS = ("NPU_Stack_Info", "Dirty Valid Len")
# The diagnosis' labels of a node's rows, most telling first: a node shows the first its rows have.
DIAGNOSIS_ORDER = ("introduces", "marginal", "inherits", "mispaired", "rounding", "unmatched", "agrees")


def worst(codes):
    best = NONE
    for c in codes:
        if _SEVERITY[c] > _SEVERITY[best]:
            best = c
    return best


def verdict_code(result):
    """Verdict code of one paired row from its verdict (`compare.verdict.Verdicts.result`)."""
    return _CODES.get(result, NONE)


@dataclass
class MergedGraph:
    """The target tree with compare rows attached.

    Attributes:
        columns: compare table columns kept for the viewer.
        rows: node name -> list of row value lists (in `columns` order).
        verdict: node name -> verdict code of its own rows.
        diagnosis: node name -> the most telling Diagnosis label of its rows ("" without one).
        match: node name -> golden node name (None when unmatched).
        golden_only: golden node names with no target counterpart, each with its target parent.
    """

    target: object
    golden: object
    columns: list
    rows: dict = field(default_factory=dict)
    verdict: dict = field(default_factory=dict)
    diagnosis: dict = field(default_factory=dict)
    match: dict = field(default_factory=dict)
    golden_only: list = field(default_factory=list)


def merge_compare(target, golden, result, labels=None):
    """Attach the rows of a compare result to the nodes of `target` and match nodes to `golden`.

    Args:
        target: ModelGraph of the target rank.
        golden: ModelGraph of the golden rank.
        result: the pair's CompareResult: its typed rows (names, pairing, verdicts) place and judge the
            rows; its table (msProbe columns) is what the viewer shows of each.
        labels: the pair's Diagnosis labels, one per row (`PairDiagnosis.labels`), or None.

    Returns:
        MergedGraph.
    """
    table, rows = result.table, result.rows
    columns = [c for c in table.columns if c not in _DROPPED_COLUMNS]
    merged = MergedGraph(target, golden, columns)
    names = rows.target["name"].to_numpy(dtype=object)
    golden_keys = rows.golden_rows["key"].to_numpy(dtype=object)
    verdicts = rows.verdicts.result
    node_labels = {}
    codes = {}
    golden_votes = {}
    for i, values in enumerate(_table_rows(table, columns)):
        node = target.find_node(names[i])
        if node is None:
            continue  # a golden-only row: shown through the golden-only nodes below
        merged.rows.setdefault(node, []).append(values)
        paired = rows.gidx[i] >= 0
        codes.setdefault(node, []).append(verdict_code(verdicts[i]) if paired else UNMATCHED)
        if labels is not None and labels[i] in DIAGNOSIS_ORDER:
            node_labels.setdefault(node, set()).add(labels[i])
        gnode = golden.find_node(golden_keys[rows.gidx[i]]) if paired else None
        if gnode is not None:
            golden_votes.setdefault(node, gnode)
    for name in target.nodes:
        merged.verdict[name] = worst(codes.get(name, ()))
        merged.diagnosis[name] = next((k for k in DIAGNOSIS_ORDER if k in node_labels.get(name, ())), "")
        merged.match[name] = golden_votes.get(name)
    _match_structure(target, golden, merged)
    _collect_golden_only(target, golden, merged)
    return merged


def _match_structure(target, golden, merged):
    """Nodes without rows (modules at some levels, scopes) match by name, else through their children."""
    for name in reversed(list(target.nodes)):  # children before parents
        if merged.match[name] is not None or name in merged.rows:
            continue  # a node with rows is matched by them (or, when none found a partner, unmatched)
        if name in golden.nodes:
            merged.match[name] = name
            continue
        parents = {golden.nodes[merged.match[c]].parent for c in target.nodes[name].children
                   if merged.match.get(c) is not None}
        parents.discard(None)
        if len(parents) == 1:
            merged.match[name] = parents.pop()
    for name, node in target.nodes.items():
        if merged.match[name] is None and merged.verdict[name] == 0 and tensor_entries(name, node.record):
            merged.verdict[name] = UNMATCHED  # it has data but nothing on the golden side


def _collect_golden_only(target, golden, merged):
    matched = {g for g in merged.match.values() if g is not None}
    back = {g: t for t, g in merged.match.items() if g is not None}
    for gname, gnode in golden.nodes.items():
        if gname in matched:
            continue
        parent = back.get(gnode.parent) if gnode.parent is not None else None
        if gnode.parent is not None and parent is None and gnode.parent not in matched:
            continue  # inside a golden-only subtree: reached through its top
        merged.golden_only.append((gname, parent))


def _table_rows(table, columns):
    """The table's rows as lists of JSON-safe Python values, converted column by column (fast)."""
    import numpy as np

    converted = []
    for c in columns:
        series = table[c]
        if series.dtype.kind in "fiu":
            arr = series.to_numpy(dtype=float)
            values = arr.astype(object)  # Python floats
            for k in np.flatnonzero(~np.isfinite(arr)):
                values[k] = _cell(float(arr[k]))
            if series.dtype.kind in "iu":
                values = series.to_numpy().astype(object)
        elif series.dtype.kind == "b":
            values = series.to_numpy().astype(object)
        else:
            values = [v if type(v) is str else _cell(v) for v in series.tolist()]
        converted.append(values)
    return [list(r) for r in zip(*converted)]


def _cell(v):
    """A table cell as a JSON-safe value (NaN/inf as strings, numpy scalars as Python)."""
    if hasattr(v, "item") and not isinstance(v, (list, tuple, dict, str)):
        try:
            v = v.item()
        except (ValueError, AttributeError):
            v = str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if v is None or isinstance(v, (int, float, str, bool)):
        return v
    return str(v)

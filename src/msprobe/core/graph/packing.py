"""Compact form of a graph for embedding in the page: column-wise, dictionary-coded, gzip + base64.

Each graph becomes two blobs, so the page draws the tree before it decodes the tensor details:

- tree:   names, parent, kind, verdict, overflow, side, match ("" = same name as the node)
- detail: the tensor table column by column (names relative to their node), row offsets, stacks

A column is {"d": [distinct values], "c": [code per row]} when values repeat, else {"v": [values]}.
Floats keep 9 significant digits (float32 round-trips; the page shows 7). `viewer.js` decodes.
Must not import torch or mindspore.
"""

import base64
import gzip
import json
import math

TREE_FIELDS = ("names", "parent", "kind", "verdict", "overflow", "side")


def _short_float(v):
    if isinstance(v, float) and math.isfinite(v) and v != 0.0:
        return float(f"{v:.9g}")
    return v


def _column(values):
    distinct = {}
    for v in values:
        key = (type(v).__name__, v)
        if key not in distinct:
            distinct[key] = len(distinct)
            if len(distinct) * 2 > len(values) + 8:
                return {"v": values}  # mostly unique: dictionary coding would not pay
    return {"d": [k[1] for k in distinct], "c": [distinct[(type(v).__name__, v)] for v in values]}


def pack_graph(entry):
    """(meta, tree, detail) dicts of one graph entry from `document.py`."""
    names = entry["names"]
    columns = entry["columns"]
    name_cols = {columns.index(c) for c in ("NPU Name",) if c in columns}
    bench_col = columns.index("Bench Name") if "Bench Name" in columns else None
    npu_col = columns.index("NPU Name") if "NPU Name" in columns else None
    offsets, cells = [0], [[] for _ in columns]
    for node, rows in zip(names, entry["rows"]):
        for row in rows or ():
            for j, v in enumerate(row):
                if j in name_cols and isinstance(v, str) and v.startswith(node + "."):
                    v = v[len(node):]  # ".output.0": the node's name is implied
                elif j == bench_col and npu_col is not None and v == row[npu_col] and v is not None:
                    v = "="
                cells[j].append(_short_float(v))
        offsets.append(len(cells[0]) if columns else 0)
    match = [("" if m == n else m) for n, m in zip(names, entry["match"])]
    tree = {k: entry[k] for k in TREE_FIELDS}
    tree["match"] = _column(match)
    detail = {"columns": columns, "offsets": offsets, "cells": [_column(c) for c in cells],
              "stack": entry["stack"], "stacks": entry["stacks"]}
    skip = set(TREE_FIELDS) | {"match", "columns", "rows", "stack", "stacks"}
    meta = {k: v for k, v in entry.items() if k not in skip}
    meta["n"] = len(names)
    return meta, tree, detail


def blob(obj):
    """gzip + base64 of compact JSON."""
    raw = json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")

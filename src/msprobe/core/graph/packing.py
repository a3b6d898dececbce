"""Compact form of a graph for embedding in the page: column-wise, dictionary-coded, gzip + base64.

Each graph becomes two blobs, so the page draws the tree before it decodes the tensor details:

- tree:   names, parent, kind, verdict, overflow, side, match ("" = same name as the node), diagnosis
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
    values = list(values)
    types = {type(v) for v in values}
    # 1, 1.0 and True are equal as dict keys: key by type as well when a column mixes them
    keys = values if types <= {str, type(None)} or len(types) == 1 else [(type(v), v) for v in values]
    distinct = dict.fromkeys(keys)
    if len(distinct) * 2 > len(values) + 8:
        return {"v": values}  # mostly unique: dictionary coding would not pay
    code = {k: i for i, k in enumerate(distinct)}
    plain = list(distinct) if keys is values else [k[1] for k in distinct]
    return {"d": plain, "c": [code[k] for k in keys]}


def pack_graph(entry):
    """(meta, tree, detail) dicts of one graph entry from `document.py`."""
    names = entry["names"]
    columns = entry["columns"]
    name_cols = {columns.index(c) for c in ("NPU Name",) if c in columns}
    bench_col = columns.index("Bench Name") if "Bench Name" in columns else None
    npu_col = columns.index("NPU Name") if "NPU Name" in columns else None
    offsets, owners, all_rows = [0], [], []
    for node, rows in zip(names, entry["rows"]):
        for row in rows or ():
            owners.append(node)
            all_rows.append(row)
        offsets.append(len(all_rows))
    cells = [list(c) for c in zip(*all_rows)] if all_rows else [[] for _ in columns]
    for j in range(len(columns)):
        col = cells[j]
        if j == bench_col and npu_col is not None:
            npu = [r[npu_col] for r in all_rows]
            cells[j] = ["=" if v == t and v is not None else v for v, t in zip(col, npu)]
        elif j in name_cols:  # ".output.0": the node's name is implied
            cells[j] = [v[len(o):] if isinstance(v, str) and v.startswith(o + ".") else v
                        for v, o in zip(col, owners)]
        else:
            cells[j] = [_short_float(v) if type(v) is float else v for v in col]
    match = [("" if m == n else m) for n, m in zip(names, entry["match"])]
    tree = {k: entry[k] for k in TREE_FIELDS}
    tree["match"] = _column(match)
    tree["diagnosis"] = _column(entry.get("diagnosis") or [""] * len(names))
    detail = {"columns": columns, "offsets": offsets, "cells": [_column(c) for c in cells],
              "stack": entry["stack"], "stacks": entry["stacks"]}
    skip = set(TREE_FIELDS) | {"match", "diagnosis", "columns", "rows", "stack", "stacks"}
    meta = {k: v for k, v in entry.items() if k not in skip}
    meta["n"] = len(names)
    return meta, tree, detail


def blob(obj):
    """gzip + base64 of compact JSON."""
    raw = json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")

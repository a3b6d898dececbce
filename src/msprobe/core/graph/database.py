"""The graph as SQLite (`*.vis.db`), for tools other than the page: one row per node and per tensor.

Tables:
    graphs(graph_id, step, rank, mode, compare_mode, framework, task, level, target_dir, golden_dir,
           start_here)
    nodes(graph_id, node_id, node_order, name, parent_id, kind, verdict, overflow, side, matched_node,
          stack_id, diagnosis) -- side: "target" or "golden" (a golden node with no target partner);
                                  diagnosis: its rows' most telling Diagnosis label
    tensors(graph_id, node_id, row_order, column..., one column per compare-table column)
    stacks(graph_id, stack_id, stack_info)
    meta(key, value)           -- format, version, diagnosis (JSON)
Must not import torch or mindspore.
"""

import json
import os
import sqlite3

_GRAPH_META = ("step", "rank", "compare_mode", "framework", "task", "level", "target", "golden", "start_here")


def write_database(doc, path):
    """Write a graph document to a fresh SQLite file at `path`."""
    if os.path.exists(path):
        os.remove(path)
    columns = []
    for g in doc["graphs"]:
        for c in g["columns"]:
            if c not in columns:
                columns.append(c)
    con = sqlite3.connect(path)
    try:
        con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
        con.execute("CREATE TABLE graphs (graph_id INTEGER PRIMARY KEY, step INTEGER, rank INTEGER, mode TEXT, "
                    "compare_mode TEXT, framework TEXT, task TEXT, level TEXT, target_dir TEXT, golden_dir TEXT, "
                    "start_here INTEGER)")
        con.execute("CREATE TABLE nodes (graph_id INTEGER, node_id INTEGER, node_order INTEGER, name TEXT, "
                    "parent_id INTEGER, kind TEXT, verdict TEXT, overflow TEXT, side TEXT, matched_node TEXT, "
                    "stack_id INTEGER, diagnosis TEXT, PRIMARY KEY (graph_id, node_id))")
        quoted = ", ".join(f'"{c}"' for c in columns)
        con.execute(f"CREATE TABLE tensors (graph_id INTEGER, node_id INTEGER, row_order INTEGER"
                    f"{', ' + quoted if columns else ''})")
        con.execute("CREATE TABLE stacks (graph_id INTEGER, stack_id INTEGER, stack_info TEXT)")
        con.executemany("INSERT INTO meta VALUES (?, ?)", [
            ("format", doc["format"]), ("version", str(doc["version"])), ("mode", doc["mode"]),
            ("diagnosis", json.dumps(doc.get("diagnosis")))])
        for gid, g in enumerate(doc["graphs"]):
            con.execute("INSERT INTO graphs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (gid, g["step"], g["rank"], doc["mode"], *[g.get(k) for k in _GRAPH_META[2:]]))
            labels = g.get("diagnosis") or [""] * len(g["names"])
            con.executemany("INSERT INTO nodes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
                (gid, i, i, name, g["parent"][i], doc["kinds"][g["kind"][i]], doc["verdicts"][g["verdict"][i]],
                 doc["overflow_levels"][g["overflow"][i]] or None, "golden" if g["side"][i] else "target",
                 g["match"][i], g["stack"][i] if g["stack"][i] >= 0 else None, labels[i] or None)
                for i, name in enumerate(g["names"])])
            where = [columns.index(c) for c in g["columns"]]
            rows = []
            for i, node_rows in enumerate(g["rows"]):
                for k, r in enumerate(node_rows or ()):
                    full = [None] * len(columns)
                    for j, v in zip(where, r):
                        full[j] = json.dumps(v) if isinstance(v, (list, dict)) else v
                    rows.append((gid, i, k, *full))
            if rows:
                marks = ", ".join("?" * (3 + len(columns)))
                con.executemany(f"INSERT INTO tensors VALUES ({marks})", rows)
            con.executemany("INSERT INTO stacks VALUES (?, ?, ?)",
                            [(gid, s, "\n".join(lines)) for s, lines in enumerate(g["stacks"])])
        con.execute("CREATE INDEX nodes_by_name ON nodes (graph_id, name)")
        con.execute("CREATE INDEX tensors_by_node ON tensors (graph_id, node_id)")
        con.commit()
    finally:
        con.close()
    return path

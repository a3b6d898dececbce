"""Read a `.vis.db` back with plain sqlite3, as another tool would."""

import json
import sqlite3


def read_graph_db(path):
    """{"mode", "diagnosis", "graphs": [{"step", "rank", "names", "parent", "verdict", "tensors"}]}."""
    con = sqlite3.connect(path)
    try:
        meta = dict(con.execute("SELECT key, value FROM meta"))
        graphs = []
        for gid, step, rank, start in con.execute("SELECT graph_id, step, rank, start_here FROM graphs ORDER BY graph_id"):
            nodes = con.execute("SELECT name, parent_id, verdict, overflow, side, matched_node FROM nodes "
                                "WHERE graph_id = ? ORDER BY node_order", (gid,)).fetchall()
            cur = con.execute("SELECT * FROM tensors WHERE graph_id = ? ORDER BY node_id, row_order", (gid,))
            cols = [d[0] for d in cur.description]
            graphs.append({"step": step, "rank": rank, "start_here": start,
                           "names": [n[0] for n in nodes], "parent": [n[1] for n in nodes],
                           "verdict": [n[2] for n in nodes], "overflow": [n[3] for n in nodes],
                           "side": [n[4] for n in nodes], "match": [n[5] for n in nodes],
                           "tensors": [dict(zip(cols, r)) for r in cur.fetchall()]})
        return {"mode": meta["mode"], "diagnosis": json.loads(meta["diagnosis"]), "graphs": graphs}
    finally:
        con.close()

"""The viewer page: viewer.html with its CSS, JS and the packed graphs inlined into one file.

The page opens from disk (file://) with no server and no network: everything it needs is inside.
Each graph is two gzip+base64 blobs (`packing.py`); the page decodes only the graph on screen, and
its tree before its tensor details. Must not import torch or mindspore.
"""

import html
import json
from importlib import resources

from msprobe.core.graph.packing import blob, pack_graph


def _asset(name):
    return resources.files("msprobe.core.graph").joinpath(name).read_text(encoding="utf-8")


def render_page(doc, title="msprobe graph"):
    """The self-contained HTML page for a graph document.

    Returns:
        str: the page's text.
    """
    index = {k: v for k, v in doc.items() if k != "graphs"}
    index["graphs"] = []
    blobs = []
    for i, entry in enumerate(doc["graphs"]):
        meta, tree, detail = pack_graph(entry)
        index["graphs"].append(meta)
        blobs.append(f'<script type="text/plain" id="g{i}-tree">{blob(tree)}</script>\n'
                     f'<script type="text/plain" id="g{i}-detail">{blob(detail)}</script>')
    # "<" only occurs inside JSON strings; \u003c keeps "</script>" in a name from ending the tag.
    index_json = json.dumps(index, separators=(",", ":"), allow_nan=False, ensure_ascii=False).replace("<", "\\u003c")
    data = f'<script type="application/json" id="graph-index">{index_json}</script>\n' + "\n".join(blobs)
    page = _asset("viewer.html")
    page = page.replace("__TITLE__", html.escape(title)).replace("__CSS__", _asset("viewer.css"))
    page = page.replace("__JS__", _asset("viewer.js"))
    head, tail = page.split("__DATA__", 1)  # last, so nothing inside the data is ever substituted
    return head + data + tail

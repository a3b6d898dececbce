"""The viewer page: viewer.html with its CSS, JS and the graph document inlined into one file.

The page opens from disk (file://) with no server and no network: everything it needs is inside.
Must not import torch or mindspore.
"""

import html
import json
from importlib import resources


def _asset(name):
    return resources.files("msprobe.core.graph").joinpath(name).read_text(encoding="utf-8")


def document_json(doc):
    """Compact JSON of the graph document (no NaN tokens: the document holds them as strings)."""
    return json.dumps(doc, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def render_page(doc, title="msprobe graph"):
    """The self-contained HTML page for a graph document.

    Returns:
        str: the page's text.
    """
    # "<" only occurs inside JSON strings; \u003c keeps "</script>" in a node name from ending the tag.
    data = document_json(doc).replace("<", "\\u003c")
    page = _asset("viewer.html")
    page = page.replace("__TITLE__", html.escape(title)).replace("__CSS__", _asset("viewer.css"))
    page = page.replace("__JS__", _asset("viewer.js"))
    head, tail = page.split("__DATA__", 1)  # last, so nothing inside the data is ever substituted
    return head + data + tail

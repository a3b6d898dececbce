"""Row labels: the vocabulary of the Diagnosis column, a pair's labels as an array, and the column's writer.

Must not import torch or mindspore.
"""
from __future__ import annotations

import numpy as np

from msprobe.core.compare import columns as C
from msprobe.core.diagnosis import flow

LABELS = (flow.INTRODUCES, flow.MARGINAL, flow.INHERITS, flow.ROUNDING, flow.AGREES, flow.UNMATCHED, flow.MISPAIRED)


def row_labels(calls, n):
    """Each of a pair's n rows' label, "" for rows no call holds."""
    out = np.empty(n, dtype=object)
    out[:] = ""
    for c in calls:
        for r in c.rows:
            out[r.index] = r.label
    return out


def label_counts(labels):
    """{label: rows} of the labels present, in LABELS' order."""
    counts = {k: int((labels == k).sum()) for k in LABELS}
    return {k: v for k, v in counts.items() if v}


def label_table(table, labels):
    """Write the Diagnosis column into a result table, right after Err_message (msProbe's columns keep
    their places)."""
    if labels is None or table is None:
        return
    if C.DIAGNOSIS in table.columns:
        table[C.DIAGNOSIS] = labels
        return
    at = list(table.columns).index(C.ERR_MESSAGE) + 1 if C.ERR_MESSAGE in table.columns else len(table.columns)
    table.insert(at, C.DIAGNOSIS, labels)

"""One step and rank diagnosed: its calls classified (`flow.py`), its rows labelled, its suspects folded
into the modules that hold them, and what one side has that the other lacks.

Must not import torch or mindspore.
"""
from __future__ import annotations

import numpy as np

from msprobe.core import naming
from msprobe.core.compare.matching import INSIDE_FUSED
from msprobe.core.diagnosis import flow
from msprobe.core.diagnosis.calls import calls_from_rows
from msprobe.core.diagnosis.labels import label_counts, row_labels
from msprobe.core.diagnosis.results import PairDiagnosis
from msprobe.core.diagnosis.thresholds import VALUE_PRESERVING_APIS
from msprobe.core.gc_pause import CollectorPause

NOTE_EXAMPLES = 5


def diagnose_pair(res, working_u):
    """One step and rank's PairDiagnosis: its labels (one per table row), counts and notes, and the
    suspects that `combine` ranks over all pairs. It keeps no reference to the pair's rows beyond its
    suspects' calls."""
    # a row object per compared value, none in a cycle: collections would walk them all again and again
    with CollectorPause():
        return _diagnose_pair(res, working_u)


def _diagnose_pair(res, working_u):
    mode = getattr(res, "mode", "statistics")
    rows = getattr(res, "rows", None)
    n = len(res.table)
    pair = PairDiagnosis(step=int(res.step or 0), rank=int(res.rank or 0), mode=mode,
                         is_proc=bool(getattr(res, "is_proc", False)), rows=n,
                         matched_rows=int(rows.matched.sum()) if rows is not None else 0,
                         merge_note=getattr(res, "merge_note", None) or None)
    if mode == "structure" or rows is None:
        if rows is not None:
            pair.labels = np.array(["matched" if m else flow.UNMATCHED for m in rows.matched], dtype=object)
        pair.note = "structure dump: no values to compare"
        return pair
    calls = calls_from_rows(rows, getattr(res, "stacks", None), working_u)
    # a cast or view golden lacks is structure, not a sign of two different models (a layout rewrite,
    # or call sequences aligned around an extra slice): it does not count towards "mostly unmatched"
    pair.rows -= sum(len(c.rows) for c in calls if not c.matched and c.short_api in VALUE_PRESERVING_APIS)
    # nor does a value inside what golden makes as one call (nn.Dense's MatMul output against F.linear)
    pair.rows -= int((rows.gidx == INSIDE_FUSED).sum())
    rd = flow.diagnose_calls(calls, working_u, _golden_unpaired(rows))
    construct = getattr(res, "construct", None) or {}
    if getattr(res, "merge_unequal", False):
        _demote_equal_averaging(rd.suspects, calls)
    suspects = _fold_modules(rd.suspects, construct)
    pair.labels = row_labels(calls, n)
    pair.compared_rows, pair.diverging_rows = rd.compared_rows, rd.diverging_rows
    pair.diverging_calls, pair.propagating_calls = rd.diverging_calls, rd.propagating_calls
    pair.first_divergence, pair.unmatched_calls = rd.first_divergence, len(rd.unmatched_calls)
    pair.label_counts = label_counts(pair.labels)
    pair.max_error, pair.cancelled_rows = rd.max_error, rd.cancelled_rows
    pair.structure = _structure_notes(calls, rows, rd)
    pair.suspects, pair.context = suspects, _suspect_context(suspects, calls, construct)
    if rd.unmatched_calls:
        pair.unmatched_examples = rd.unmatched_calls[:NOTE_EXAMPLES]
    return pair


def _golden_unpaired(rows):
    """(base, direction) of the golden calls no target row pairs with."""
    g_keys = rows.golden_rows["key"].to_numpy(dtype=object)
    if not len(g_keys):
        return frozenset()
    paired = set(g_keys[rows.gidx[rows.matched]].tolist())
    return frozenset(naming.split_key(k)[:2] for k in dict.fromkeys(g_keys.tolist()) if k not in paired)


def _demote_equal_averaging(suspects, calls):
    """Data-parallel ranks on unequal parts of the batch: their gradients, averaged with equal weights, are
    not the whole batch's, so parameter gradients and what the optimizer computes from them differ by
    design. Their suspects are listed as marginal, not a divergence."""
    first_backward = min((c.order for c in calls if c.direction == "backward"), default=None)
    if first_backward is None:
        return
    for s in suspects:
        if s.call.is_param_grad or (s.call.direction == "forward" and s.call.order > first_backward):
            s.tier = flow.WEAK
            s.reason += ("; the data-parallel ranks hold unequal parts of the batch, and gradients averaged with "
                         "equal weights differ from the whole batch's by design")


def _structure_notes(calls, rows, rd):
    """What one side has and the other lacks, and whether it matters: arguments that differ while no
    value does, calls the target makes that golden
    does not (casts, views and copies whose values downstream agree are harmless), casts and views
    paired by index with a golden call that works on other values, and golden calls nothing in the
    target pairs with."""
    foreign = {o.producer for s in rd.suspects if s.kind == flow.FOREIGN_INPUT for o in s.origins.values()}
    harmless, other = [], []
    mispaired = set(rd.mispaired_calls)
    for c in calls:
        if c.matched or c.direction == "debug" or c.key in mispaired:
            continue
        (harmless if c.short_api in VALUE_PRESERVING_APIS and c.key not in foreign else other).append(c.key)
    g_keys = rows.golden_rows["key"].to_numpy(dtype=object)
    kept = rows.matched & ~np.isin(rows.target["key"].to_numpy(dtype=object), list(mispaired))
    paired = set(g_keys[rows.gidx[kept]].tolist()) if len(g_keys) else set()
    golden_only = [k for k in dict.fromkeys(g_keys.tolist()) if k not in paired]
    return {"idle_arguments": [{"argument": what, "count": len(keys), "examples": keys[:NOTE_EXAMPLES]}
                               for what, keys in rd.idle_arguments],
            "extra_harmless": {"count": len(harmless), "examples": harmless[:NOTE_EXAMPLES]},
            "extra_other": {"count": len(other), "examples": other[:NOTE_EXAMPLES]},
            "mispaired": {"count": len(mispaired), "examples": rd.mispaired_calls[:NOTE_EXAMPLES]},
            "golden_only": {"count": len(golden_only), "examples": golden_only[:NOTE_EXAMPLES]}}


def module_path(key, construct):
    """Enclosing modules of a node, outermost first, from construct.json (node -> parent)."""
    chain, seen = [], {key}
    parent = construct.get(key)
    while parent and parent not in seen:
        chain.append(parent)
        seen.add(parent)
        parent = construct.get(parent)
    return chain[::-1]


def _fold_modules(suspects, construct):
    """A module whose error is introduced by a call inside it is not a suspect of its own: the innermost
    call is named and the module kept as context."""
    by_key = {s.call.key: s for s in suspects}
    folded = set()
    for s in suspects:
        for anc in module_path(s.call.key, construct):
            if anc in by_key and by_key[anc] is not s:
                folded.add(anc)
                if anc not in s.folded_modules:
                    s.folded_modules.append(anc)
    return [s for s in suspects if s.call.key not in folded]


def _suspect_context(suspects, calls, construct):
    """Per suspect key, (enclosing modules, stack lines: a backward call's from its forward call), so
    that a PairDiagnosis keeps its suspects and not the pair's calls or construct.json."""
    by_key = {c.key: c for c in calls}
    context = {}
    for s in suspects:
        stack = s.call.stack
        fwd = by_key.get(naming.forward_of(s.call.key))
        if not stack and fwd is not None:
            stack = fwd.stack
        context[s.call.key] = (module_path(s.call.key, construct), stack)
    return context

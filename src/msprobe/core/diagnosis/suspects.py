"""`diagnose(results)`: the API or module where error is *introduced*, ranked over steps and ranks.

Reads each compare pair's typed rows (`CompareResult.rows`), stacks and construct.json as compare
loaded them, decides the run's working precision, classifies every call (`flow.py`), labels every row
(the table's Diagnosis column) and returns the JSON-ready account that diagnosis.json holds.
Must not import torch or mindspore.
"""
from __future__ import annotations

import math

import numpy as np

from msprobe.core import naming
from msprobe.core.diagnosis import flow, op_model
from msprobe.core.diagnosis.calls import (TENSOR_METRICS, calls_from_rows, dtype_census, implicit_lowering, row_labels,
                                         working_precision)
from msprobe.core.diagnosis.report import stack_line
from msprobe.core.compare.matching import INSIDE_FUSED
from msprobe.core.diagnosis.thresholds import (AMPLIFICATION, DTYPE_NOISE_FLOOR, EVIDENCE_ROWS, INTRODUCED_RATIO,
                                               MAX_SUSPECTS, MIN_MATCHED_SHARE, ROUNDING_UNITS, UNIT_ROUNDOFF,
                                               VALUE_PRESERVING_APIS, WORKING_PRECISION_SHARE)
from msprobe.core.gc_pause import CollectorPause

TIER_NAMES = {flow.STRONG: "strong", flow.AMPLIFYING: "amplifying", flow.WEAK: "weak",
              flow.COMM: "communication"}
_CARRIED_KINDS = (flow.PARAMETER, flow.FIRST_INPUT)
DIAGNOSIS_COLUMN = "Diagnosis"
LABELS = (flow.INTRODUCES, flow.MARGINAL, flow.INHERITS, flow.ROUNDING, flow.AGREES, flow.UNMATCHED, flow.MISPAIRED)
NOTE_EXAMPLES = 5


def diagnose(results, precision=None):
    """Name where error enters, from the results of one compare, and label every row.

    Args:
        results: CompareResults (one per step and rank) from `compare_dumps`; any other object with
            `table` (and optionally `step`, `rank`, `mode`) is read back through
            `compare.table_reader.result_from_table` (its table's rows without a record name are left out).
        precision: the precision the target may round to everywhere (a float dtype name such as
            "bfloat16", or "tf32" for accelerators whose float32 matmuls round to it). Defaults to the
            coarsest float dtype the target holds where golden holds a finer one, on at least a tenth of
            the compared tensors (autocast's dtype); without one, golden's own precision.

    Returns:
        dict, JSON-serialisable: `divergence`, `mostly_unmatched`, `verdict`, `mode`, `precision`,
        `suspects`, `receiving_ranks`, `ranks` (per step and rank counts, labels and structure notes),
        `thresholds`. Each result's table gains the `Diagnosis` column (after `Err_message`): introduces,
        marginal, inherits, rounding, agrees or unmatched, as the account says of that row.

    Raises:
        MsprobeError: `precision` is not a known precision.

    Example:
        >>> from msprobe.core.compare import compare_dumps                 # doctest: +SKIP
        >>> d = diagnose(compare_dumps("run_bf16", "run_fp32"))              # doctest: +SKIP
        >>> d["suspects"][0]["api"]                                          # doctest: +SKIP
        'Functional.softmax.1.forward'
    """
    results = sorted((_typed(r) for r in results), key=lambda r: (r.step or 0, r.rank or 0))
    census = PrecisionCensus()
    for res in results:
        census.add(res)
    working, working_u = census.decide(precision)
    per_rank = [diagnose_pair(res, working_u) for res in results]
    return combine(per_rank, working, working_u, inferred=precision is None)


class PrecisionCensus:
    """The dtype pairs of the matched float tensors seen so far: what decides the working precision,
    gathered one compare pair at a time (a many-rank compare keeps one pair's rows at once)."""

    def __init__(self):
        self.counts, self.total, self.lowered = {}, 0, set()

    def add(self, result):
        self._count(*dtype_census(result))
        self.lowered |= implicit_lowering(result)

    def merge(self, other):
        self._count(other.counts, other.total)
        self.lowered |= getattr(other, "lowered", set())

    def _count(self, counts, total):
        for dtype, k in counts.items():
            self.counts[dtype] = self.counts.get(dtype, 0) + k
        self.total += total

    def decide(self, precision=None):
        """(dtype, unit roundoff): `precision` when given (checked), else the census' working precision."""
        if precision is None:
            return working_precision(self.counts, self.total, WORKING_PRECISION_SHARE, self.lowered)
        from msprobe.core.compare.dtypes import canonical_dtype
        from msprobe.core.errors import ConfigError
        name = canonical_dtype(precision)
        if name not in UNIT_ROUNDOFF:
            raise ConfigError("precision", precision, ", ".join(UNIT_ROUNDOFF))
        return name, UNIT_ROUNDOFF[name]


def combine(per_rank, working, working_u, inferred=True, reload=None):
    """diagnosis.json's content from the `diagnose_pair` entries of every step and rank.

    `reload(entry)` gives an entry again with every suspect's evidence: needed only when a suspect
    whose evidence `trim_evidence` let go is among the ones listed."""
    # grouping and ranking make an object or three per suspect while the suspects' rows are alive (a
    # million on a big pair): collections meanwhile walked them all, again and again
    with CollectorPause():
        return _combine(per_rank, working, working_u, inferred, reload)


def _combine(per_rank, working, working_u, inferred, reload):
    per_rank = sorted(per_rank, key=lambda p: (p["step"], p["rank"]))
    groups = _rank_suspects(per_rank)
    for g in groups[:MAX_SUSPECTS]:
        if g["suspect"].trimmed:
            _restore_evidence(g, reload)
    suspects = [_suspect_dict(g) for g in groups[:MAX_SUSPECTS]]
    modes = sorted({p["mode"] for p in per_rank})
    # Marginal suspects (weak) are listed but are not a divergence: two correct runs on different
    # hardware get there, and --fail-on-divergence must not flake on them.
    divergence = any(g["suspect"].tier != flow.WEAK for g in groups)
    receiving = receiving_ranks(groups)
    compared = sum(p["rows"] for p in per_rank)
    matched = sum(p["matched_rows"] for p in per_rank)
    mostly_unmatched = compared > 0 and matched < MIN_MATCHED_SHARE * compared
    d = {
        "divergence": divergence,
        "mostly_unmatched": mostly_unmatched,
        "verdict": _verdict(divergence, suspects, len(groups), receiving, per_rank, working, (matched, compared)),
        "mode": modes[0] if len(modes) == 1 else modes,
        "precision": {"working": working, "unit_roundoff": working_u, "inferred": inferred},
        "suspects": suspects,
        "suspect_count": len(groups),
        "receiving_ranks": receiving,
        "ranks": [{k: v for k, v in p.items() if not k.startswith("_")} for p in per_rank],
        "thresholds": {"noise_floor": dict(DTYPE_NOISE_FLOOR), "rounding_units": ROUNDING_UNITS,
                       "amplification": AMPLIFICATION, "introduced_ratio": INTRODUCED_RATIO,
                       "working_precision_share": WORKING_PRECISION_SHARE,
                       "min_matched_share": MIN_MATCHED_SHARE},
    }
    return _json_safe(d)


def _typed(result):
    """A result with typed rows: one from compare_dumps as it is; anything else with a `table` (a CSV
    read with pandas, msProbe's or ours) read back through compare's table reader."""
    if getattr(result, "rows", None) is not None or getattr(result, "mode", None) == "structure":
        return result
    from msprobe.core.compare.table_reader import result_from_table
    return result_from_table(result.table, getattr(result, "mode", None), getattr(result, "step", 0) or 0,
                             getattr(result, "rank", 0) or 0, bool(getattr(result, "is_proc", False)))


def diagnose_pair(res, working_u):
    """One step and rank: its Diagnosis column (set on `res.table`) and its entry in diagnosis.json's
    `ranks`, with the suspects (keys starting with "_") that `combine` ranks over all pairs. The entry
    keeps no reference to the pair's rows beyond its suspects' calls."""
    # a row object per compared value, none in a cycle: collections would walk them all again and again
    with CollectorPause():
        return _diagnose_pair(res, working_u)


def _diagnose_pair(res, working_u):
    mode = getattr(res, "mode", "statistics")
    rows = getattr(res, "rows", None)
    n = len(res.table)
    entry = {"step": int(res.step or 0), "rank": int(res.rank or 0), "mode": mode,
             "is_proc": bool(getattr(res, "is_proc", False)), "rows": n,
             "matched_rows": int(rows.matched.sum()) if rows is not None else 0}
    if getattr(res, "merge_note", None):
        entry["merge_note"] = res.merge_note
    if mode == "structure" or rows is None:
        labels = None
        if rows is not None:
            labels = ["matched" if m else flow.UNMATCHED for m in rows.matched]
        entry.update(compared_rows=0, diverging_rows=0, diverging_calls=0, propagating_calls=0, suspects=0,
                     first_divergence=None, unmatched_calls=0, labels={},
                     note="structure dump: no values to compare", _suspects=[], _context={})
        _set_column(res, labels)
        return entry
    calls = calls_from_rows(rows, getattr(res, "stacks", None), working_u)
    # a cast or view golden lacks is structure, not a sign of two different models (a layout rewrite,
    # or call sequences aligned around an extra slice): it does not count towards "mostly unmatched"
    entry["rows"] -= sum(len(c.rows) for c in calls if not c.matched and c.short_api in VALUE_PRESERVING_APIS)
    # nor does a value inside what golden makes as one call (nn.Dense's MatMul output against F.linear)
    entry["rows"] -= int((rows.gidx == INSIDE_FUSED).sum())
    rd = flow.diagnose_calls(calls, working_u, _golden_unpaired(rows))
    construct = getattr(res, "construct", None) or {}
    if getattr(res, "merge_unequal", False):
        _demote_equal_averaging(rd.suspects, calls)
    suspects = _fold_modules(rd.suspects, construct)
    labels = row_labels(calls, n)
    _set_column(res, labels)
    counts = {k: int((labels == k).sum()) for k in LABELS}
    entry.update(compared_rows=rd.compared_rows, diverging_rows=rd.diverging_rows,
                 diverging_calls=rd.diverging_calls, propagating_calls=rd.propagating_calls,
                 suspects=len(suspects), first_divergence=rd.first_divergence,
                 unmatched_calls=len(rd.unmatched_calls), labels={k: v for k, v in counts.items() if v},
                 max_error=rd.max_error, cancelled_rows=rd.cancelled_rows,
                 structure=_structure_notes(calls, rows, rd),
                 _suspects=suspects, _context=_suspect_context(suspects, calls, construct))
    if rd.unmatched_calls:
        entry["unmatched_examples"] = rd.unmatched_calls[:NOTE_EXAMPLES]
    return entry


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


def _set_column(res, labels):
    """The Diagnosis column, right after Err_message (msProbe's columns keep their places)."""
    table = res.table
    if labels is None or table is None:
        return
    if DIAGNOSIS_COLUMN in table.columns:
        table[DIAGNOSIS_COLUMN] = labels
        return
    at = list(table.columns).index("Err_message") + 1 if "Err_message" in table.columns else len(table.columns)
    table.insert(at, DIAGNOSIS_COLUMN, labels)


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
        api = (c.api_name or "").rsplit(".", 1)[-1]
        (harmless if api in VALUE_PRESERVING_APIS and c.key not in foreign else other).append(c.key)
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


def trim_evidence(entry, keep=MAX_SUSPECTS):
    """Let go of the rows of an entry's suspects past its first `keep` (strongest, then earliest): a pair
    can hold thousands, and only MAX_SUSPECTS are listed over all pairs. What ranks them stays."""
    from msprobe.core.diagnosis.calls import Call
    ranked = sorted(entry["_suspects"], key=lambda s: (s.tier, s.call.order))
    for s in ranked[keep:]:
        c = s.call
        s.call = Call(key=c.key, order=c.order, direction=c.direction, is_module=c.is_module)
        s.origins, s.trimmed = {}, True
        entry["_context"].pop(c.key, None)
    return entry


def _restore_evidence(group, reload):
    """A listed suspect whose rows `trim_evidence` let go: its call, origins and context again."""
    s, entry = group["suspect"], group["rank_entry"]
    fresh = reload(entry) if reload is not None else None
    again = next((x for x in (fresh or {}).get("_suspects", []) if x.call.key == s.call.key), None)
    if again is None:
        raise RuntimeError(f"the evidence of {s.call.key} (step {entry['step']}, rank {entry['rank']}) was "
                           f"let go and cannot be read again")
    s.call, s.origins, s.trimmed = again.call, again.origins, False
    entry["_context"][s.call.key] = fresh["_context"][s.call.key]


def _suspect_context(suspects, calls, construct):
    """Per suspect key, (enclosing modules, stack lines: a backward call's from its forward call), so
    that an entry keeps its suspects and not the pair's calls or construct.json."""
    by_key = {c.key: c for c in calls}
    context = {}
    for s in suspects:
        stack = s.call.stack
        fwd = by_key.get(op_model.forward_key_of(s.call.key))
        if not stack and fwd is not None:
            stack = fwd.stack
        context[s.call.key] = (module_path(s.call.key, construct), stack)
    return context


def _rank_suspects(per_rank):
    """One list over all steps and ranks: the same call suspected (for the same reason) on several
    ranks or steps is one entry ({"suspect", "rank_entry", "ranks", "steps"}), its evidence from the
    earliest step and lowest rank.

    Order: strong introducers before amplifications, marginal ones and collectives; then the earliest
    step; then execution order. Parameters and first inputs of a step after one where values already
    differed are carried over from it (the optimizer wrote them), so they are not listed again.
    """
    first_step = min((p["step"] for p in per_rank if p.get("diverging_rows")), default=None)
    _demote_cross_rank_arrivals(per_rank)
    groups = {}
    for p in per_rank:  # sorted by (step, rank)
        for s in p.get("_suspects", []):
            if p["step"] != first_step and s.kind in _CARRIED_KINDS:
                continue
            g = groups.setdefault((s.call.key, s.kind), {"suspect": s, "rank_entry": p, "ranks": set(),
                                                          "steps": set()})
            g["ranks"].add(p["rank"])
            g["steps"].add(p["step"])
    return sorted(groups.values(), key=lambda g: (g["suspect"].tier, g["rank_entry"]["step"],
                                                  g["suspect"].call.order, g["rank_entry"]["rank"]))


def _demote_cross_rank_arrivals(per_rank):
    """Ranks exchange data outside recorded calls too (DDP's gradient all-reduce runs inside autograd).
    When another rank of the same step diverged earlier, a rank's entry point that no recorded call
    explains (an input without producer, parameter gradients) is most likely that rank's error arriving:
    list it with the collectives, after the introducers."""
    earliest = {}
    for p in per_rank:
        for s in p.get("_suspects", []):
            if s.tier == flow.STRONG:
                key = (p["step"], p["rank"])
                earliest[key] = min(earliest.get(key, s.call.order), s.call.order)
    for p in per_rank:
        others = [(order, rank) for (step, rank), order in earliest.items()
                  if step == p["step"] and rank != p["rank"]]
        if not others:
            continue
        first_order, first_rank = min(others)
        for s in p.get("_suspects", []):
            arrival = s.kind == flow.FIRST_INPUT or (s.kind == flow.INTRODUCED and s.call.is_param_grad)
            if arrival and s.call.order > first_order:
                s.kind, s.tier = flow.RECEIVED, flow.COMM
                s.reason = (f"{s.reason}; rank {first_rank} diverged earlier, and ranks exchange values outside "
                            f"recorded calls too (e.g. DDP's gradient all-reduce)")


def _suspect_dict(group):
    s, rank_entry = group["suspect"], group["rank_entry"]
    ranks, steps = sorted(group["ranks"]), sorted(group["steps"])
    call = s.call
    path, stack = rank_entry["_context"][call.key]
    return {
        "api": call.key,
        "kind": s.kind,
        "tier": TIER_NAMES[s.tier],
        "direction": call.direction,
        "step": rank_entry["step"],
        "steps": steps,
        "rank": ranks[0],
        "ranks": ranks,
        "is_proc": rank_entry["is_proc"],
        "module": path[-1] if path else (call.key if call.is_module else None),
        "module_path": path,
        "reason": s.reason,
        "input_error": s.input_error,
        "output_error": s.output_error,
        "amplification": s.amplification,
        "stack": stack_line(stack),
        "inputs": _evidence(call.inputs, s.origins),
        "outputs": _evidence(call.outputs, {}),
        "also_explains": s.folded_modules,
    }


def _evidence(rows, origins):
    tensor_rows = [r for r in rows if r.matched and (r.is_tensor or r.flags)]
    tensor_rows.sort(key=lambda r: (not r.differs, -r.error if math.isfinite(r.error) else -math.inf))
    out = []
    for r in tensor_rows[:EVIDENCE_ROWS]:
        item = {"name": r.name, "diagnosis": r.label, "error": r.error, "noise_floor": r.floor,
                "diverges": r.differs, "flags": sorted(r.flags | ({"dtype"} if r.coarser else set())),
                "target_dtype": r.target_dtype,
                "golden_dtype": r.golden_dtype,
                "target": dict(zip(("max", "min", "mean", "norm"), r.target)),
                "golden": dict(zip(("max", "min", "mean", "norm"), r.golden))}
        if r.tensor_metrics:
            item["tensor_metrics"] = {c: v for (c, _), v in zip(TENSOR_METRICS, r.tensor_metrics)}
        if r.name in origins:
            item["origin"] = origins[r.name].text
        out.append(item)
    return out


def _place(p):
    return ("process " if p["is_proc"] else "rank ") + str(p["rank"])


def _verdict(divergence, suspects, count, receiving, per_rank, working, matched_compared):
    matched, compared = matched_compared
    prefix = ""
    if compared and matched < MIN_MATCHED_SHARE * compared:
        prefix = (f"the dumps mostly do not match: {compared - matched} of {compared} target values have no "
                  f"golden counterpart (different models, or a mapping is missing); ")
    if per_rank and all(p["mode"] == "structure" for p in per_rank):
        return prefix + "nothing to diagnose: structure dumps hold no values"
    beyond = f"beyond {working} precision" if working else "beyond noise"
    if not divergence:
        return _no_divergence(prefix, beyond, count, suspects, per_rank, working) + _idle_note(per_rank)
    top = suspects[0]
    ranks = ", ".join(str(r) for r in top["ranks"])
    word = "process" if top["is_proc"] else "rank"
    verdict = (f"error is introduced in {top['direction']} at {top['api']} "
               f"(step {top['step']}, {word}{'es' if word == 'process' and len(top['ranks']) > 1 else ''}"
               f"{'s' if word == 'rank' and len(top['ranks']) > 1 else ''} {ranks}): {top['reason']}")
    if receiving:
        verdict += (f"; rank{'s' if len(receiving) > 1 else ''} {', '.join(str(r) for r in receiving)} "
                    f"only receive{'' if len(receiving) > 1 else 's'} it from other ranks")
    return prefix + verdict


def _no_divergence(prefix, beyond, count, suspects, per_rank, working):
    rows = sum(p["compared_rows"] for p in per_rank)
    if rows == 0:
        return prefix + "nothing to diagnose: no value of the target has a counterpart in golden"
    if suspects:
        top = suspects[0]
        return (prefix + f"no divergence {beyond}: {count} call(s) just past what rounding and "
                f"their inputs explain, the first {top['api']} (step {top['step']}): {top['reason']}")
    places = list(dict.fromkeys(_place(p) for p in per_rank))
    steps = len({p["step"] for p in per_rank})
    where = (", ".join(places[:4]) + (" ..." if len(places) > 4 else "")
             + (f" over {steps} steps" if steps > 1 else ""))
    if working:
        worst = max((p.get("max_error", 0.0) for p in per_rank), default=0.0)
        return (prefix + f"no divergence {beyond}: {rows} compared values on {where} differ by at most "
                f"{worst:.2g} (relative), which rounding to {working} and the ops explain")
    return prefix + f"no divergence: {rows} compared values on {where} agree within the noise floor of their dtypes"


def _idle_note(per_rank):
    """'; use_cache differs (False vs golden True) at 4 calls; no value is affected', over all pairs."""
    seen = {}
    for p in per_rank:
        for a in (p.get("structure") or {}).get("idle_arguments", ()):
            seen[a["argument"]] = seen.get(a["argument"], 0) + a["count"]
    if not seen:
        return ""
    if len(seen) == 1:
        (arg, n), = seen.items()
        what = arg.replace(" (", " differs (", 1) + f" at {n} call{'s' if n > 1 else ''}"
    else:
        what = ", ".join(f"{arg} at {n} call{'s' if n > 1 else ''}" for arg, n in seen.items()) + " differ"
    return f"; {what}; no value is affected"


def receiving_ranks(groups):
    """Ranks whose every suspect is a received one: they diverge only because other ranks did."""
    introducing = {r for g in groups if g["suspect"].tier != flow.COMM for r in g["ranks"]}
    return sorted({r for g in groups if g["suspect"].tier == flow.COMM for r in g["ranks"]} - introducing)


def _json_safe(value):
    """inf/nan as the strings "inf"/"-inf"/"nan" (as in dump.json), tuples as lists, sets sorted."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, set):
        return sorted(_json_safe(v) for v in value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    try:
        return _json_safe(float(value))
    except (TypeError, ValueError):
        return str(value)

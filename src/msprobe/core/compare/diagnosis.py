"""Diagnosis after a compare: the API or module where error is *introduced*, ranked over steps and ranks.

`diagnose(results)` takes the engine's per-(step, rank) compare results and returns a JSON-ready dict:
`divergence` (bool), `verdict` (one sentence), `suspects` (ranked, each with the evidence: errors of
inputs and outputs, where the diverging inputs came from, module path, stack line, ranks) and a per-rank
account. `format_diagnosis(d)` renders it for the terminal. The classification of single calls lives in
`diagnosis_flow`, the reading of table rows in `diagnosis_rows`, the tolerances in
`diagnosis_thresholds`. Must not import torch or mindspore; pandas only arrives inside the tables.

Example:
    >>> from msprobe.core.compare.engine import compare_dumps      # doctest: +SKIP
    >>> d = diagnose(compare_dumps("run_bf16", "run_fp32"))        # doctest: +SKIP
    >>> d["suspects"][0]["api"]                                      # doctest: +SKIP
    'Functional.softmax.1.forward'
"""
from __future__ import annotations

import math
import os

from msprobe.core.compare import diagnosis_flow as flow
from msprobe.core.compare.diagnosis_report import format_diagnosis, stack_line  # noqa: F401 (re-export)
from msprobe.core.compare.diagnosis_errors import number
from msprobe.core.compare.diagnosis_rows import TENSOR_METRIC_COLUMNS, calls_from_table
from msprobe.core.compare.diagnosis_thresholds import (AMPLIFICATION, AMPLIFIED_ONLY, BACKWARD_AMPLIFIED,
                                                      DTYPE_NOISE_FLOOR, EVIDENCE_ROWS, MAX_SUSPECTS)
from msprobe.core.dump.reader import load_json

TIER_NAMES = {flow.STRONG: "strong", flow.AMPLIFYING: "amplifying", flow.WEAK: "weak",
              flow.COMM: "communication"}
_CARRIED_KINDS = (flow.PARAMETER, flow.FIRST_INPUT)


def diagnose(results):
    """Name where error enters, from the results of one compare.

    Args:
        results: iterable of CompareResult (one per step and rank) with `.step`, `.rank`, `.mode`,
            `.table` (pandas DataFrame, msProbe's columns) and `.target_dir` (rank dir of the target run;
            its construct.json gives module paths, its stack.json stack lines when the table has none).

    Returns:
        dict, JSON-serialisable: `divergence`, `verdict`, `mode`, `suspects`, `receiving_ranks` (ranks
        that only receive the error from others), `ranks` (per step and rank counts), `thresholds`.
    """
    per_rank = []
    for res in sorted(results, key=lambda r: (r.step or 0, r.rank or 0)):
        per_rank.append(_diagnose_rank(res))
    suspects = _rank_suspects(per_rank)
    modes = sorted({p["mode"] for p in per_rank})
    # Calls just past the noise floor (weak suspects) are listed but are not a divergence: two correct
    # runs on different hardware get there, and --fail-on-divergence must not flake on them.
    divergence = any(s["tier"] != TIER_NAMES[flow.WEAK] for s in suspects)
    d = {
        "divergence": divergence,
        "verdict": _verdict(divergence, suspects, per_rank),
        "mode": modes[0] if len(modes) == 1 else modes,
        "suspects": suspects[:MAX_SUSPECTS],
        "receiving_ranks": receiving_ranks(suspects),
        "ranks": [{k: v for k, v in p.items() if not k.startswith("_")} for p in per_rank],
        "thresholds": {"noise_floor": dict(DTYPE_NOISE_FLOOR), "amplification": AMPLIFICATION,
                       "amplified_only": AMPLIFIED_ONLY, "backward_amplified": BACKWARD_AMPLIFIED},
    }
    return _json_safe(d)


def _diagnose_rank(res):
    mode = getattr(res, "mode", "statistics")
    entry = {"step": int(res.step or 0), "rank": int(res.rank or 0), "mode": mode,
             "is_proc": bool(getattr(res, "is_proc", False))}
    if mode == "structure":
        entry.update(compared_rows=0, diverging_rows=0, diverging_calls=0, propagating_calls=0, suspects=0,
                     first_divergence=None, unmatched_calls=0,
                     note="structure dump: no values to compare", _suspects=[], _calls={}, _construct={})
        return entry
    calls = calls_from_table(res.table)
    target_dir = getattr(res, "target_dir", None)
    _fill_stacks(calls, target_dir)
    rd = flow.diagnose_calls(calls)
    construct = _construct_of(target_dir)
    suspects = _fold_modules(rd.suspects, construct)
    entry.update(compared_rows=rd.compared_rows, diverging_rows=rd.diverging_rows,
                 diverging_calls=rd.diverging_calls, propagating_calls=rd.propagating_calls,
                 suspects=len(suspects), first_divergence=rd.first_divergence,
                 unmatched_calls=len(rd.unmatched_calls), _suspects=suspects,
                 _calls={c.key: c for c in calls}, _construct=construct)
    if rd.unmatched_calls:
        entry["unmatched_examples"] = rd.unmatched_calls[:5]
    return entry


def _construct_of(rank_dir):
    if not rank_dir:
        return {}
    path = os.path.join(str(rank_dir), "construct.json")
    construct = load_json(path) if os.path.isfile(path) else {}
    return construct if isinstance(construct, dict) else {}


def _fill_stacks(calls, rank_dir):
    """Stacks from stack.json when the table has no stack column (the engine adds one when it can)."""
    if any(c.stack_cell is not None for c in calls) or not rank_dir:
        return
    if not os.path.isfile(os.path.join(str(rank_dir), "stack.json")):
        return
    from msprobe.core.dump.reader import DumpReader
    stacks = DumpReader(str(rank_dir)).stack
    for c in calls:
        c.stack = list(stacks.get(c.key, []))


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


def _rank_suspects(per_rank):
    """One list over all steps and ranks: the same call suspected (for the same reason) on several
    ranks or steps is one entry, its evidence from the earliest step and lowest rank.

    Order: strong introducers before amplifications, weak ones and collectives; then the earliest
    step; then execution order. Parameters and first inputs of a step after one that already diverged
    are carried over from it (the optimizer wrote them), so they are not listed again.
    """
    first_step = min((p["step"] for p in per_rank if p.get("_suspects")), default=None)
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
    ordered = sorted(groups.values(), key=lambda g: (g["suspect"].tier, g["rank_entry"]["step"],
                                                     g["suspect"].call.order, g["rank_entry"]["rank"]))
    return [_suspect_dict(g["suspect"], g["rank_entry"], sorted(g["ranks"]), sorted(g["steps"]))
            for g in ordered]


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


def _suspect_dict(s, rank_entry, ranks, steps):
    call = s.call
    calls, construct = rank_entry["_calls"], rank_entry["_construct"]
    path = module_path(call.key, construct)
    stack = call.stack
    fwd = flow.forward_key_of(call.key)
    if not stack and fwd in calls:
        stack = calls[fwd].stack
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
    tensor_rows.sort(key=lambda r: (not r.diverges, -r.error if math.isfinite(r.error) else -math.inf))
    out = []
    for r in tensor_rows[:EVIDENCE_ROWS]:
        item = {"name": r.name, "error": r.error, "noise_floor": r.floor, "diverges": r.diverges,
                "flags": sorted(r.flags), "target_dtype": r.target_dtype, "golden_dtype": r.golden_dtype,
                "target": dict(zip(("max", "min", "mean", "norm"), r.target)),
                "golden": dict(zip(("max", "min", "mean", "norm"), r.golden))}
        if r.tensor_metrics:
            item["tensor_metrics"] = {c: number(v) for c, v in zip(TENSOR_METRIC_COLUMNS, r.tensor_metrics)}
        if r.name in origins:
            item["origin"] = origins[r.name]
        out.append(item)
    return out


def _verdict(divergence, suspects, per_rank):
    n_ranks = len({p["rank"] for p in per_rank})
    if per_rank and all(p["mode"] == "structure" for p in per_rank):
        return "nothing to diagnose: structure dumps hold no values"
    if not divergence:
        rows = sum(p["compared_rows"] for p in per_rank)
        if rows == 0:
            return "nothing to diagnose: no value of the target has a counterpart in golden"
        if suspects:
            top = suspects[0]
            return (f"no divergence beyond noise: {len(suspects)} call(s) just past the noise floor of their "
                    f"dtypes (within {AMPLIFICATION:g}x of it), the first {top['api']} (step {top['step']}): "
                    f"{top['reason']}")
        return (f"no divergence: {rows} compared values on {n_ranks} rank(s) agree within the noise floor "
                f"of their dtypes")
    top = suspects[0]
    ranks = ", ".join(str(r) for r in top["ranks"])
    word = "process" if top["is_proc"] else "rank"
    verdict = (f"error is introduced in {top['direction']} at {top['api']} "
               f"(step {top['step']}, {word}{'s' if len(top['ranks']) > 1 else ''} {ranks}): {top['reason']}")
    receiving = receiving_ranks(suspects)
    if receiving:
        verdict += (f"; {word}{'s' if len(receiving) > 1 else ''} {', '.join(str(r) for r in receiving)} "
                    f"only receive{'' if len(receiving) > 1 else 's'} it from other ranks")
    return verdict


def receiving_ranks(suspects):
    """Ranks whose every suspect is a received one: they diverge only because other ranks did."""
    introducing = {r for s in suspects if s["tier"] != "communication" for r in s["ranks"]}
    return sorted({r for s in suspects if s["tier"] == "communication" for r in s["ranks"]} - introducing)


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

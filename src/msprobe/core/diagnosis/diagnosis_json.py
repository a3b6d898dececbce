"""diagnosis.json's writer: a `Diagnosis` as the JSON-ready dict the file holds (key order included).

Must not import torch or mindspore.
"""
from __future__ import annotations

import math


def diagnosis_json(d):
    """The content of diagnosis.json for a `results.Diagnosis`."""
    out = {
        "divergence": d.divergence,
        "mostly_unmatched": d.mostly_unmatched,
        "verdict": d.verdict,
        "mode": d.mode,
        "precision": {"working": d.precision.working, "unit_roundoff": d.precision.unit_roundoff,
                      "inferred": d.precision.inferred},
        "suspects": [suspect_json(s) for s in d.suspects],
        "suspect_count": d.suspect_count,
        "receiving_ranks": d.receiving_ranks,
        "ranks": [pair_json(p) for p in d.pairs],
        "thresholds": d.thresholds,
    }
    out = json_safe(out)
    if d.failed_pairs is not None:
        out["failed_pairs"] = d.failed_pairs
    return out


def pair_json(p):
    """A `PairDiagnosis` as an entry of diagnosis.json's `ranks`."""
    out = {"step": p.step, "rank": p.rank, "mode": p.mode, "is_proc": p.is_proc, "rows": p.rows,
           "matched_rows": p.matched_rows}
    if p.merge_note:
        out["merge_note"] = p.merge_note
    out.update(compared_rows=p.compared_rows, diverging_rows=p.diverging_rows, diverging_calls=p.diverging_calls,
               propagating_calls=p.propagating_calls, suspects=len(p.suspects), first_divergence=p.first_divergence,
               unmatched_calls=p.unmatched_calls, labels=p.label_counts)
    if p.note is not None:  # a structure dump: nothing was judged
        out["note"] = p.note
        return out
    out.update(max_error=p.max_error, cancelled_rows=p.cancelled_rows, structure=p.structure)
    if p.unmatched_examples:
        out["unmatched_examples"] = p.unmatched_examples
    return out


def suspect_json(s):
    return {
        "api": s.api, "kind": s.kind, "tier": s.tier, "direction": s.direction, "step": s.step, "steps": s.steps,
        "rank": s.rank, "ranks": s.ranks, "is_proc": s.is_proc, "module": s.module, "module_path": s.module_path,
        "reason": s.reason, "input_error": s.input_error, "output_error": s.output_error,
        "amplification": s.amplification, "stack": s.stack,
        "inputs": [evidence_json(r) for r in s.inputs], "outputs": [evidence_json(r) for r in s.outputs],
        "also_explains": s.also_explains,
    }


def evidence_json(r):
    item = {"name": r.name, "diagnosis": r.diagnosis, "error": r.error, "noise_floor": r.noise_floor,
            "diverges": r.diverges, "flags": r.flags, "target_dtype": r.target_dtype, "golden_dtype": r.golden_dtype,
            "target": r.target, "golden": r.golden}
    if r.tensor_metrics is not None:
        item["tensor_metrics"] = r.tensor_metrics
    if r.origin is not None:
        item["origin"] = r.origin
    return item


def json_safe(value):
    """inf/nan as the strings "inf"/"-inf"/"nan" (as in dump.json), tuples as lists, sets sorted."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, set):
        return sorted(json_safe(v) for v in value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    try:
        return json_safe(float(value))
    except (TypeError, ValueError):
        return str(value)


def diagnosis_from_json(doc):
    """A `results.Diagnosis` from diagnosis.json's content (to print one read back from its file). Its
    pairs hold their counts and notes; diagnosis.json has no calls, so their suspects are placeholders."""
    from msprobe.core.diagnosis.results import Diagnosis, Evidence, PairDiagnosis, Precision, Suspect

    def evidence(r):
        return Evidence(**{**r, "error": _number(r["error"]), "noise_floor": _number(r["noise_floor"])})

    def suspect(s):
        return Suspect(**{**s, "input_error": _number(s["input_error"]), "output_error": _number(s["output_error"]),
                          "amplification": _number(s["amplification"]),
                          "inputs": [evidence(r) for r in s["inputs"]], "outputs": [evidence(r) for r in s["outputs"]]})

    def pair(p):
        p = dict(p)
        p["label_counts"], p["suspects"] = p.pop("labels"), [None] * p["suspects"]
        if "max_error" in p:
            p["max_error"] = _number(p["max_error"])
        return PairDiagnosis(**p)

    precision = doc["precision"]
    # the file's verdict is the unmatched clause, "; ", the finding (verdict.join) when mostly unmatched
    unmatched, _, finding = doc["verdict"].partition("; ") if doc["mostly_unmatched"] else (None, "", doc["verdict"])
    return Diagnosis(divergence=doc["divergence"], mostly_unmatched=doc["mostly_unmatched"], verdict=doc["verdict"],
                     unmatched=unmatched, finding=finding,
                     mode=doc["mode"], precision=Precision(precision["working"], precision["unit_roundoff"],
                                                           precision["inferred"]),
                     suspects=[suspect(s) for s in doc["suspects"]], suspect_count=doc["suspect_count"],
                     receiving_ranks=doc["receiving_ranks"], pairs=[pair(p) for p in doc["ranks"]],
                     thresholds=doc["thresholds"], failed_pairs=doc.get("failed_pairs"))


def _number(v):
    """json_safe's "inf"/"-inf"/"nan" back to floats."""
    return float(v) if v in ("inf", "-inf", "nan") else v

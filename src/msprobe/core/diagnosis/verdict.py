"""The verdict: one sentence saying where error is introduced, or why nothing is.

Must not import torch or mindspore.
"""
from __future__ import annotations

from msprobe.core.diagnosis.thresholds import MIN_MATCHED_SHARE


def join(unmatched, finding):
    """The verdict sentence: the unmatched clause (when there is one), then the finding."""
    return f"{unmatched}; {finding}" if unmatched else finding


def unmatched_clause(pairs):
    """The clause the verdict starts with when most target values of the PairDiagnosis `pairs` have no
    golden counterpart, else None."""
    compared = sum(p.rows for p in pairs)
    matched = sum(p.matched_rows for p in pairs)
    if compared and matched < MIN_MATCHED_SHARE * compared:
        return (f"the dumps mostly do not match: {compared - matched} of {compared} target values have no "
                f"golden counterpart (different models, or a mapping is missing)")
    return None


def finding(divergence, suspects, count, receiving, pairs, working):
    """What the verdict says of the values: for a run's listed `suspects` (of `count` found) over its
    PairDiagnosis `pairs`."""
    if pairs and all(p.mode == "structure" for p in pairs):
        return "nothing to diagnose: structure dumps hold no values"
    beyond = f"beyond {working} precision" if working else "beyond noise"
    if not divergence:
        return _no_divergence(beyond, count, suspects, pairs, working) + _idle_note(pairs)
    top = suspects[0]
    ranks = ", ".join(str(r) for r in top.ranks)
    word = "process" if top.is_proc else "rank"
    sentence = (f"error is introduced in {top.direction} at {top.api} "
                f"(step {top.step}, {word}{'es' if word == 'process' and len(top.ranks) > 1 else ''}"
                f"{'s' if word == 'rank' and len(top.ranks) > 1 else ''} {ranks}): {top.reason}")
    if receiving:
        sentence += (f"; rank{'s' if len(receiving) > 1 else ''} {', '.join(str(r) for r in receiving)} "
                     f"only receive{'' if len(receiving) > 1 else 's'} it from other ranks")
    return sentence


def _place(p):
    return ("process " if p.is_proc else "rank ") + str(p.rank)


def _no_divergence(beyond, count, suspects, pairs, working):
    rows = sum(p.compared_rows for p in pairs)
    if rows == 0:
        return "nothing to diagnose: no value of the target has a counterpart in golden"
    if suspects:
        top = suspects[0]
        return (f"no divergence {beyond}: {count} call(s) just past what rounding and "
                f"their inputs explain, the first {top.api} (step {top.step}): {top.reason}")
    places = list(dict.fromkeys(_place(p) for p in pairs))
    steps = len({p.step for p in pairs})
    where = (", ".join(places[:4]) + (" ..." if len(places) > 4 else "")
             + (f" over {steps} steps" if steps > 1 else ""))
    if working:
        worst = max((p.max_error if p.max_error is not None else 0.0 for p in pairs), default=0.0)
        return (f"no divergence {beyond}: {rows} compared values on {where} differ by at most "
                f"{worst:.2g} (relative), which rounding to {working} and the ops explain")
    return f"no divergence: {rows} compared values on {where} agree within the noise floor of their dtypes"


def _idle_note(pairs):
    """'; use_cache differs (False vs golden True) at 4 calls; no value is affected', over all pairs."""
    seen = {}
    for p in pairs:
        for a in (p.structure or {}).get("idle_arguments", ()):
            seen[a["argument"]] = seen.get(a["argument"], 0) + a["count"]
    if not seen:
        return ""
    if len(seen) == 1:
        (arg, n), = seen.items()
        what = arg.replace(" (", " differs (", 1) + f" at {n} call{'s' if n > 1 else ''}"
    else:
        what = ", ".join(f"{arg} at {n} call{'s' if n > 1 else ''}" for arg, n in seen.items()) + " differ"
    return f"; {what}; no value is affected"

"""A suspect's evidence: the rows shown for it, let go for the suspects of a pair that will not be
listed (a pair can hold thousands) and read again for one that is.

Must not import torch or mindspore.
"""
from __future__ import annotations

import math

from msprobe.core.diagnosis.calls import TENSOR_METRICS, Call
from msprobe.core.diagnosis.results import Evidence
from msprobe.core.diagnosis.thresholds import EVIDENCE_ROWS, MAX_SUSPECTS


def trim_evidence(pair, keep=MAX_SUSPECTS):
    """Let go of the rows of a PairDiagnosis' suspects past its first `keep` (strongest, then earliest):
    only MAX_SUSPECTS are listed over all pairs. What ranks them stays."""
    ranked = sorted(pair.suspects, key=lambda s: (s.tier, s.call.order))
    for s in ranked[keep:]:
        c = s.call
        s.call = Call(key=c.key, order=c.order, direction=c.direction, is_module=c.is_module)
        s.origins, s.trimmed = {}, True
        pair.context.pop(c.key, None)
    return pair


def restore_evidence(suspect, pair, reload):
    """A listed suspect whose rows `trim_evidence` let go: its call, origins and context again, from
    `reload(pair)` (the pair diagnosed again)."""
    fresh = reload(pair) if reload is not None else None
    again = next((x for x in (fresh.suspects if fresh is not None else ()) if x.call.key == suspect.call.key), None)
    if again is None:
        raise RuntimeError(f"the evidence of {suspect.call.key} (step {pair.step}, rank {pair.rank}) was "
                           f"let go and cannot be read again")
    suspect.call, suspect.origins, suspect.trimmed = again.call, again.origins, False
    pair.context[suspect.call.key] = fresh.context[suspect.call.key]


def evidence(rows, origins):
    """The Evidence rows of a call's inputs or outputs: the most telling EVIDENCE_ROWS, worst first."""
    tensor_rows = [r for r in rows if r.matched and (r.is_tensor or r.flags)]
    tensor_rows.sort(key=lambda r: (not r.differs, -r.error if math.isfinite(r.error) else -math.inf))
    out = []
    for r in tensor_rows[:EVIDENCE_ROWS]:
        out.append(Evidence(
            name=r.name, diagnosis=r.label, error=r.error, noise_floor=r.floor, diverges=r.differs,
            flags=sorted(r.flags | ({"dtype"} if r.coarser else set())), target_dtype=r.target_dtype,
            golden_dtype=r.golden_dtype, target=dict(zip(("max", "min", "mean", "norm"), r.target)),
            golden=dict(zip(("max", "min", "mean", "norm"), r.golden)),
            tensor_metrics={c: v for (c, _), v in zip(TENSOR_METRICS, r.tensor_metrics)} if r.tensor_metrics else None,
            origin=origins[r.name].text if r.name in origins else None))
    return out

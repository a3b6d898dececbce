"""The suspects of all steps and ranks as one ranked list: the same call suspected on several ranks or
steps is one Suspect, error that arrives from another rank is listed after the ranks that introduce it.

Must not import torch or mindspore.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from msprobe.core.diagnosis import flow
from msprobe.core.diagnosis.evidence import evidence
from msprobe.core.diagnosis.report import stack_line
from msprobe.core.diagnosis.results import Suspect

TIER_NAMES = {flow.STRONG: "strong", flow.AMPLIFYING: "amplifying", flow.WEAK: "weak",
              flow.COMM: "communication"}
_CARRIED_KINDS = (flow.PARAMETER, flow.FIRST_INPUT)


@dataclass
class SuspectGroup:
    """One call suspected (for one reason) on some steps and ranks; its evidence from `pair`."""

    suspect: object              # flow.CallSuspect
    pair: object                 # PairDiagnosis: the earliest step, lowest rank
    ranks: set = field(default_factory=set)
    steps: set = field(default_factory=set)


def rank_suspects(pairs):
    """SuspectGroups over all steps and ranks (`pairs` sorted by step and rank).

    Order: strong introducers before amplifications, marginal ones and collectives; then the earliest
    step; then execution order. Parameters and first inputs of a step after one where values already
    differed are carried over from it (the optimizer wrote them), so they are not listed again.
    """
    first_step = min((p.step for p in pairs if p.diverging_rows), default=None)
    _demote_cross_rank_arrivals(pairs)
    groups = {}
    for p in pairs:
        for s in p.suspects:
            if p.step != first_step and s.kind in _CARRIED_KINDS:
                continue
            g = groups.setdefault((s.call.key, s.kind), SuspectGroup(s, p))
            g.ranks.add(p.rank)
            g.steps.add(p.step)
    return sorted(groups.values(), key=lambda g: (g.suspect.tier, g.pair.step, g.suspect.call.order, g.pair.rank))


def _demote_cross_rank_arrivals(pairs):
    """Ranks exchange data outside recorded calls too (DDP's gradient all-reduce runs inside autograd).
    When another rank of the same step diverged earlier, a rank's entry point that no recorded call
    explains (an input without producer, parameter gradients) is most likely that rank's error arriving:
    list it with the collectives, after the introducers."""
    earliest = {}
    for p in pairs:
        for s in p.suspects:
            if s.tier == flow.STRONG:
                key = (p.step, p.rank)
                earliest[key] = min(earliest.get(key, s.call.order), s.call.order)
    for p in pairs:
        others = [(order, rank) for (step, rank), order in earliest.items() if step == p.step and rank != p.rank]
        if not others:
            continue
        first_order, first_rank = min(others)
        for s in p.suspects:
            arrival = s.kind == flow.FIRST_INPUT or (s.kind == flow.INTRODUCED and s.call.is_param_grad)
            if arrival and s.call.order > first_order:
                s.kind, s.tier = flow.RECEIVED, flow.COMM
                s.reason = (f"{s.reason}; rank {first_rank} diverged earlier, and ranks exchange values outside "
                            f"recorded calls too (e.g. DDP's gradient all-reduce)")


def receiving_ranks(groups):
    """Ranks whose every suspect is a received one: they diverge only because other ranks did."""
    introducing = {r for g in groups if g.suspect.tier != flow.COMM for r in g.ranks}
    return sorted({r for g in groups if g.suspect.tier == flow.COMM for r in g.ranks} - introducing)


def listed_suspect(group):
    """The Suspect a group is listed as, its evidence from its pair."""
    s, pair = group.suspect, group.pair
    ranks, steps = sorted(group.ranks), sorted(group.steps)
    call = s.call
    path, stack = pair.context[call.key]
    return Suspect(
        api=call.key, kind=s.kind, tier=TIER_NAMES[s.tier], direction=call.direction, step=pair.step,
        steps=steps, rank=ranks[0], ranks=ranks, is_proc=pair.is_proc,
        module=path[-1] if path else (call.key if call.is_module else None), module_path=path,
        reason=s.reason, input_error=s.input_error, output_error=s.output_error, amplification=s.amplification,
        stack=stack_line(stack), inputs=evidence(call.inputs, s.origins), outputs=evidence(call.outputs, {}),
        also_explains=list(s.folded_modules))

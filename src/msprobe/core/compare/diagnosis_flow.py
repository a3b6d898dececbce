"""Where error enters one rank's run: each call classified as matching, propagating or introducing.

Walks the calls of one (step, rank) in execution order and decides, for every call with a diverging
row, whether its divergence is explained by something earlier:

- a diverging input is *explained* when the target value it carries was produced by an earlier call
  whose output already diverged (found by its statistics: the same tensor has the same Max/Min/Mean/Norm
  wherever it is recorded), or, when no recorded call produced it, by any earlier divergence;
- it is *not explained* when it is a parameter, a changed scalar argument, a value produced by a call
  golden does not have, or the very first divergence of the run (model input, untracked computation);
- a backward call whose forward diverged is explained by that forward (its saved tensors differ);
- a collective's output may differ because another rank diverged.

A call whose outputs diverge although its inputs match (or whose outputs are far worse than its
inputs, or whose diverging inputs are not explained) is a suspect: the place error is *introduced*.
Must not import torch or mindspore.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from msprobe.core import naming
from msprobe.core.compare.diagnosis_rows import ARGUMENT, CHECKSUM, DTYPE, NONFINITE, SHAPE
from msprobe.core.compare.diagnosis_thresholds import (AMPLIFICATION, AMPLIFIED_ONLY, BACKWARD_AMPLIFIED,
                                                      COMMUNICATION_PREFIXES)

# Suspect kinds, and the tier each is ranked in (lower first).
OVERFLOW = "overflow"            # finite inputs, inf/nan outputs
INTRODUCED = "introduced"        # matching inputs, diverging outputs
PARAMETER = "parameter"          # a parameter differs before any computation used it
ARGUMENT_CHANGED = "argument"    # a scalar argument differs (eps, scale, dim ...)
FOREIGN_INPUT = "foreign_input"  # an input produced by a call that golden does not have
FIRST_INPUT = "input"            # the run's first divergence is in an input no recorded call produced
AMPLIFIED = "amplified"          # diverging inputs, outputs far worse
RECEIVED = "communication"       # a collective returns diverging values from other ranks
STRONG, AMPLIFYING, WEAK, COMM = 0, 1, 2, 3


@dataclass
class Suspect:
    call: object                 # diagnosis_rows.Call
    kind: str
    tier: int
    input_error: float
    output_error: float
    amplification: float
    reason: str
    origins: dict = field(default_factory=dict)   # input row name -> where its value came from
    folded_modules: list = field(default_factory=list)


@dataclass
class RankDiagnosis:
    """The outcome for one (step, rank)."""

    suspects: list
    diverging_calls: int
    propagating_calls: int
    compared_rows: int
    diverging_rows: int
    unmatched_calls: list
    first_divergence: str | None


def _max_error(rows):
    errs = [r.error for r in rows if r.matched and r.is_tensor]
    return max(errs) if errs else 0.0


def _floor(rows):
    floors = [r.floor for r in rows if r.matched and r.is_tensor]
    return max(floors) if floors else 0.0


def forward_key_of(key):
    """The forward record of a backward or parameters_grad key (None for other keys)."""
    base, direction, index = naming.split_key(key)
    if direction not in (naming.BACKWARD, "parameters_grad"):
        return None
    prefix, _, rest = base.partition(".")
    if naming.is_module_key(key):
        path, _, cls = rest.rpartition(".")
        return naming.module_key(prefix, path, cls, naming.FORWARD, index)
    return naming.api_key(prefix, rest, index, naming.FORWARD)


def _is_communication(key):
    return key.startswith(COMMUNICATION_PREFIXES)


class _Producers:
    """Target values seen so far as outputs: value key -> (call, row) of the latest producer."""

    def __init__(self):
        self._by_value = {}

    def add(self, call, rows):
        for r in rows:
            k = r.value_key()
            if k is not None:
                self._by_value[k] = (call, r)

    def find(self, row):
        k = row.value_key()
        return self._by_value.get(k) if k is not None else None


def _parameter_index(calls):
    """Target value key -> 'weight of Module.fc.Linear' for every parameter row in the table."""
    index = {}
    for c in calls:
        for r in c.inputs:
            if r.is_parameter and r.value_key() is not None:
                base = naming.split_key(c.key)[0]
                index.setdefault(r.value_key(), f"parameter '{r.slot}' of {base}")
    return index


def diagnose_calls(calls):
    """Classify every call of one (step, rank); see the module docstring for the rules.

    Args:
        calls: list of diagnosis_rows.Call in execution order.

    Returns:
        RankDiagnosis with suspects in call order (ranking across ranks happens in diagnosis.py).
    """
    walk = _RankWalk(calls)
    for call in calls:
        walk.visit(call)
    first = next((c.key for c in calls if c.key in walk.diverged_keys), None)
    return RankDiagnosis(suspects=walk.suspects, diverging_calls=len(walk.diverged_keys),
                         propagating_calls=walk.propagating, compared_rows=walk.compared_rows,
                         diverging_rows=walk.diverging_rows, unmatched_calls=walk.unmatched,
                         first_divergence=first)


class _RankWalk:
    """The state of one walk through a rank's calls: what has been produced, what already diverged."""

    def __init__(self, calls):
        self.producers = _Producers()
        self.params = _parameter_index(calls)
        self.calls_by_key = {c.key: c for c in calls}
        self.diverged_keys = set()
        self.unmatched = []
        self.carriers = set()      # calls golden lacks whose inputs already diverged: they pass it on
        self.reported = {}         # value key of a diverging input already blamed -> that suspect's key
        self.suspects = []
        self.suspect_by_key = {}
        self.propagating = 0
        self.seen_divergence = self.seen_nonfinite = False
        self.last_matching = None  # the latest call whose rows all match: error entered after it
        self.compared_rows = self.diverging_rows = 0

    def visit(self, call):
        self.compared_rows += sum(1 for r in call.rows if r.matched)
        self.diverging_rows += sum(1 for r in call.rows if r.diverges)
        if not call.matched:
            self.unmatched.append(call.key)
            if any(self._fed_by_divergence(r) for r in call.inputs):
                self.carriers.add(call.key)
            self.producers.add(call, call.outputs)
            return
        div_in = [r for r in call.inputs if r.diverges]
        div_out = [r for r in call.outputs if r.diverges]
        if not div_in and not div_out:
            self.last_matching = call.key
        else:
            self.diverged_keys.add(call.key)
            inner = self._inner_producers(call, div_out)
            suspect = None if inner else self._classify(call, div_in, div_out)
            for key in inner:
                # A module's diverging outputs are values a call inside it produced: that call is the
                # place to look (named already if it introduced the error), the module is context.
                if key in self.suspect_by_key:
                    self.suspect_by_key[key].folded_modules.append(call.key)
            if suspect is None:
                self.propagating += 1
            else:
                self.suspects.append(suspect)
                self.suspect_by_key[call.key] = suspect
                for r in div_in:
                    if r.value_key() is not None:
                        self.reported.setdefault(r.value_key(), call.key)
            self.seen_divergence = True
            self.seen_nonfinite = self.seen_nonfinite or any(NONFINITE in r.flags for r in div_in + div_out)
        self.producers.add(call, call.outputs)

    def _inner_producers(self, call, div_out):
        """For a module whose every diverging output was produced by an earlier diverging call: the keys
        of those calls (modules are recorded after the calls inside them); otherwise an empty list."""
        if not call.is_module or call.direction != "forward" or not div_out:
            return []
        keys = []
        for r in div_out:
            found = self.producers.find(r)
            if found is None or not found[0].matched or not found[1].diverges:
                return []
            keys.append(found[0].key)
        return keys

    def _fed_by_divergence(self, row):
        found = self.producers.find(row)
        return found is not None and found[1].diverges

    def _origin_of(self, row):
        """(explained, where-from text, kind if not explained) for one diverging input row."""
        if ARGUMENT in row.flags:
            return False, "a scalar argument with a different value", ARGUMENT_CHANGED
        found = self.producers.find(row)
        if found is not None:
            src_call, src_row = found
            if not src_call.matched:
                if DTYPE in row.flags and any(r.is_tensor and r.target_dtype == row.golden_dtype
                                              for r in src_call.inputs):
                    return False, (f"output of {src_call.key}, which golden does not have, casting "
                                   f"{row.golden_dtype} to {row.target_dtype}"), FOREIGN_INPUT
                if src_call.key in self.carriers:
                    return True, f"output of {src_call.key} (golden lacks it), computed from values already off", None
                return False, f"output of {src_call.key}, which golden does not have", FOREIGN_INPUT
            if src_row.diverges:
                return True, f"output of {src_call.key} (already off)", None
        value = row.value_key()
        param = self.params.get(value) if value is not None else None
        if row.is_parameter or param is not None:
            if value is not None and value in self.reported:
                return True, f"{param or 'a parameter'}, already found differing at {self.reported[value]}", None
            return False, param or "a parameter", PARAMETER
        after = f"; it entered after {self.last_matching}" if self.last_matching else ""
        if NONFINITE in row.flags and not self.seen_nonfinite:
            return False, f"inf/nan that no recorded call produced{after}", FIRST_INPUT
        if self.seen_divergence:
            return True, "not produced by a recorded call; earlier calls already diverge", None
        if row.role == "input" and direction_of_row(row) == "backward":
            return False, (f"a gradient no recorded backward produced (an unrecorded backward ran in "
                           f"between, e.g. a custom autograd Function){after}"), FIRST_INPUT
        return False, f"not produced by any recorded call (model input or untracked computation){after}", FIRST_INPUT

    def _hidden_input_error(self, call):
        """Backward calls also read tensors saved in forward; parameter gradients are reduced or
        accumulated outside recorded calls. The error those hidden inputs may carry (inf: unknown, but
        earlier divergence may reach them), or None when they cannot differ."""
        if call.is_param_grad:
            return math.inf if self.seen_divergence else None
        fwd = forward_key_of(call.key) if call.direction == "backward" else None
        if fwd not in self.diverged_keys:
            return None
        return max(_max_error(self.calls_by_key[fwd].rows), 0.0) if fwd in self.calls_by_key else math.inf

    def _classify(self, call, div_in, div_out):
        """The Suspect this diverging call is, or None when its divergence only propagates."""
        in_err, out_err = _max_error(call.inputs), _max_error(call.outputs)
        floor = max(_floor(call.outputs), _floor(call.inputs), 1e-30)
        hidden_err = self._hidden_input_error(call)
        if hidden_err is not None:
            # A backward whose forward diverged: its saved tensors differ, whatever else matches. Named
            # only when its outputs are far worse than everything it read (a wrong backward formula).
            if not math.isfinite(out_err) or not math.isfinite(hidden_err):
                return None  # inf/nan carried on from a forward overflow, or hidden inputs unknown
            amplification = out_err / max(in_err, hidden_err, floor)
            if amplification < BACKWARD_AMPLIFIED or not div_out:
                return None
            r = max(div_out, key=lambda x: x.error)
            return Suspect(call=call, kind=AMPLIFIED, tier=AMPLIFYING, input_error=max(in_err, hidden_err),
                           output_error=out_err, amplification=amplification,
                           reason=f"its forward diverged by at most {hidden_err:.2g} and its gradient inputs by "
                                  f"{in_err:.2g}, but {_short(r.name)} is off by {r.error:.2g} ({amplification:.0f}x)")
        amplification = out_err / max(in_err, floor)
        origins, unexplained = {}, []
        for r in div_in:
            explained, text, kind = self._origin_of(r)
            origins[r.name] = text
            if not explained:
                unexplained.append((r, kind))

        def make(kind, tier, reason):
            return Suspect(call=call, kind=kind, tier=tier, input_error=in_err, output_error=out_err,
                           amplification=amplification, reason=reason, origins=origins)

        finite_inputs = all(r.target_finite for r in call.inputs if r.is_tensor)
        new_nonfinite = [r for r in div_out if NONFINITE in r.flags and not r.target_finite]
        if new_nonfinite and finite_inputs:
            r = new_nonfinite[0]
            golden = "golden finite" if r.golden_finite else "golden's inf/nan sit elsewhere"
            return make(OVERFLOW, STRONG, f"inputs are finite but {_short(r.name)} holds inf/nan ({golden})")
        if unexplained:
            r, kind = max(unexplained, key=lambda u: (bool(u[0].flags), u[0].error))
            return make(kind, _tier(r), f"{_short(r.name)} differs ({_describe(r)}) and is {origins[r.name]}")
        if not div_in:
            if in_err > 0 and out_err < AMPLIFICATION * in_err and not _flagged(div_out):
                return None  # input error below the noise floor grown a little past it
            if not any(r.is_tensor for r in call.inputs) and self.seen_divergence:
                return None  # inputs not dumped (data_mode) or none: earlier divergence may reach it
            if _is_communication(call.key):
                return make(RECEIVED, COMM, "a collective returns values that differ although this rank sent "
                                            "matching ones: another rank diverged")
            r = max(div_out, key=lambda x: (bool(x.flags), x.error))
            return make(INTRODUCED, _tier(r), f"inputs match but {_short(r.name)} differs ({_describe(r)})")
        if div_out and amplification >= AMPLIFIED_ONLY and not _is_communication(call.key):
            r = max(div_out, key=lambda x: x.error)
            return make(AMPLIFIED, AMPLIFYING, f"inputs are off by at most {in_err:.2g} but {_short(r.name)} "
                                               f"by {r.error:.2g} ({amplification:.0f}x)")
        return None


def direction_of_row(row):
    return "backward" if ".backward." in row.name else "forward"


def _tier(row):
    """Strong when a flag says so or the error is well past the noise floor; weak just past it."""
    return STRONG if row.flags or row.error >= AMPLIFICATION * row.floor else WEAK


def _flagged(rows):
    return any(r.flags for r in rows)



def _short(row_name):
    """'Functional.softmax.1.forward.input.0' -> 'input.0'."""
    for marker in (".input.", ".output.", ".parameters."):
        if marker in row_name:
            return marker[1:] + row_name.split(marker, 1)[1]
    return row_name.rsplit(".", 1)[-1]


def _describe(row):
    bits = []
    if DTYPE in row.flags:
        bits.append(f"{row.target_dtype} vs golden {row.golden_dtype}")
    if NONFINITE in row.flags:
        bits.append("inf/nan differ")
    if SHAPE in row.flags:
        bits.append("shape differs")
    if CHECKSUM in row.flags:
        bits.append("checksum differs")
    if ARGUMENT in row.flags:
        bits.append(f"{_fmt(row.target[0])} vs golden {_fmt(row.golden[0])}")
    if row.is_tensor and math.isfinite(row.error):
        bits.append(f"relative error {row.error:.2g}")
    return ", ".join(bits)


def _fmt(v):
    return f"{v:.6g}" if isinstance(v, float) else str(v)

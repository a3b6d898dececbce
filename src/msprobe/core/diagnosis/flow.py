"""Where error enters one rank's run: each call classified as agreeing, inheriting or introducing.

Walks the calls of one (step, rank) in execution order and decides, for every call with a differing
row, whether its difference is explained by something earlier:

- a call may round its inputs and outputs to the run's working precision (bf16 under autocast: a few
  unit roundoffs), and may grow the error its inputs carry by what the op explains: not at all for
  casts, views and copies; pieces of an input (slices, a cat's backward) by the whole's size over the
  piece's; with its input's range for exp-like ops; up to `AMPLIFICATION` for others.
  Output error beyond `INTRODUCED_RATIO` times that is error the call *introduces*;
- a differing input is *explained* when the target value it carries was produced by an earlier call
  whose output already differed (found by its statistics: the same tensor has the same Max/Min/Mean/Norm
  wherever it is recorded), or, when no recorded call produced it, by earlier differences unrecorded
  work may carry (no more than `AMPLIFICATION` times the largest seen);
- it is *not explained* when it is a parameter, a changed scalar argument, a value produced by a call
  golden does not have, or the very first difference of the run (model input, untracked computation);
- a changed scalar argument whose call's outputs agree (HF's `use_cache` under gradient checkpointing)
  affects no value: it is a structure note, and a (marginal) suspect only when values elsewhere in the
  step differ beyond rounding;
- a backward call also reads what its forward saved: the forward's error explains its outputs too;
- a collective's output may differ because another rank diverged.

Every row gets its label for the Diagnosis column: introduces, marginal (introduced just past what is
explained), inherits, rounding (within the working precision), agrees, unmatched, or mispaired (a cast
or view paired by call index with a golden call that works on other values).
Must not import torch or mindspore.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from msprobe.core import naming
from msprobe.core.diagnosis import op_model
from msprobe.core.diagnosis.calls import ARGUMENT, DTYPE, NONFINITE
from msprobe.core.diagnosis.report import describe_row, short_name, stack_line
from msprobe.core.diagnosis.thresholds import (AMPLIFICATION, COMMUNICATION_PREFIXES, INTRODUCED_RATIO,
                                               ROUNDING_UNITS, STRONG_OVER_FLOOR, VALUE_PRESERVING_APIS)

# Suspect kinds, and the tier each is ranked in (lower first).
OVERFLOW = "overflow"            # finite inputs, inf/nan outputs
INTRODUCED = "introduced"        # matching inputs, outputs beyond what rounding explains
PARAMETER = "parameter"          # a parameter differs before any computation used it
ARGUMENT_CHANGED = "argument"    # a scalar argument differs (eps, scale, dim ...)
FOREIGN_INPUT = "foreign_input"  # an input produced by a call that golden does not have
FIRST_INPUT = "input"            # the run's first difference is in an input no recorded call produced
AMPLIFIED = "amplified"          # differing inputs, outputs far beyond what the op explains
RECEIVED = "communication"       # a collective returns differing values from other ranks
STRONG, AMPLIFYING, WEAK, COMM = 0, 1, 2, 3

# Row labels (the Diagnosis column).
INTRODUCES, MARGINAL, INHERITS, ROUNDING, AGREES, UNMATCHED, MISPAIRED = (
    "introduces", "marginal", "inherits", "rounding", "agrees", "unmatched", "mispaired")


@dataclass(frozen=True)
class Origin:
    """Where a differing input's value came from."""

    text: str                    # for the report: "output of Tensor.to.3.forward (already off)" ...
    kind: str | None = None      # the suspect kind when nothing earlier explains it, else None
    strong: bool = False         # unexplained and well past its floor (or flagged)
    producer: str | None = None  # key of the recorded call that produced the value


@dataclass
class CallSuspect:
    """A call of one step and rank whose difference nothing earlier explains (ranked over all pairs
    into `results.Suspect`)."""

    call: object                 # calls.Call
    kind: str
    tier: int
    input_error: float
    output_error: float
    amplification: float         # output error over what inputs and rounding explain
    reason: str
    origins: dict = field(default_factory=dict)   # input row name -> Origin
    folded_modules: list = field(default_factory=list)
    trimmed: bool = False        # its call's rows were let go (evidence.trim_evidence)
    idle: bool = False           # a changed argument whose call's outputs agree: no value is affected


@dataclass
class RankDiagnosis:
    """The outcome for one (step, rank)."""

    suspects: list
    diverging_calls: int
    propagating_calls: int
    compared_rows: int
    diverging_rows: int
    unmatched_calls: list
    mispaired_calls: list
    first_divergence: str | None
    max_error: float             # the largest error of a row no suspect holds (the noise level)
    cancelled_rows: int          # outputs that cancelled to nearly zero (judged against their inputs)
    idle_arguments: list = field(default_factory=list)  # "use_cache (False vs golden True)" -> call keys


def _max_error(rows):
    errs = [r.error for r in rows if r.matched and r.is_tensor and not r.cancelled]
    return max(errs) if errs else 0.0


def _is_communication(key):
    return key.startswith(COMMUNICATION_PREFIXES)


class _Producers:
    """Target values seen so far as outputs: value key -> (call, row) of the latest producer."""

    def __init__(self):
        self._by_value = {}

    def add(self, call, rows):
        passed = _passed_through(call)
        for r in rows:
            k = r.value_key()
            if k is not None and not (k in passed and k in self._by_value):
                self._by_value[k] = (call, r)

    def find(self, row):
        k = row.value_key()
        return self._by_value.get(k) if k is not None else None


def _passed_through(call):
    """Value keys of a call's outputs that golden holds inside one call (matching.INSIDE_FUSED) and that
    are one of its inputs unchanged (nn.Dense's BiasAdd and Reshape hand the incoming gradient on inside
    F.linear): the value's producer stays the call that made it, so an error it carries is traced there."""
    ins = {r.value_key() for r in call.inputs if r.is_tensor}
    return {k for r in call.outputs if r.inside and (k := r.value_key()) is not None and k in ins}


def _parameter_index(calls):
    """Target value key -> 'parameter 'weight' of Module.fc.Linear' for every parameter row."""
    index = {}
    for c in calls:
        for r in c.inputs:
            if r.is_parameter and r.value_key() is not None:
                base = naming.split_key(c.key)[0]
                index.setdefault(r.value_key(), f"parameter '{r.slot}' of {base}")
    return index


def diagnose_calls(calls, working_u=0.0, golden_unpaired=frozenset()):
    """Classify every call of one (step, rank) and label its rows; see the module docstring.

    Args:
        calls: list of calls.Call in execution order.
        working_u: unit roundoff of the run's working precision (0.0 when golden's precision).
        golden_unpaired: (base, direction) of golden's calls no target call pairs with: a target call of
            the same API left unpaired is one the pairing missed, not one golden lacks.

    Returns:
        RankDiagnosis with suspects in call order (ranking across ranks happens in ranking.py).
    """
    walk = _RankWalk(calls, working_u)
    walk.golden_unpaired = golden_unpaired
    for call in calls:
        walk.visit(call)
    if walk.diverged:  # values differ somewhere: an argument that changed may be why, so it is listed
        for s in walk.idle:
            s.tier = WEAK
            s.reason += "; its call's outputs agree, but values elsewhere in this step differ"
        walk.suspects = sorted(walk.suspects + walk.idle, key=lambda s: s.call.order)
    first = next((c.key for c in calls if c.key in walk.diverged_keys), None)
    return RankDiagnosis(suspects=walk.suspects, diverging_calls=len(walk.diverged_keys),
                         propagating_calls=walk.propagating, compared_rows=walk.compared_rows,
                         diverging_rows=walk.diverging_rows, unmatched_calls=walk.unmatched,
                         mispaired_calls=walk.mispaired,
                         first_divergence=first, max_error=walk.noise,
                         cancelled_rows=sum(r.cancelled for c in calls for r in c.outputs),
                         idle_arguments=_idle_argument_notes(walk.idle))


def _idle_argument_notes(idle):
    """[(what differs, [call keys])] for the changed arguments no value depends on, one per argument."""
    notes = {}
    for s in idle:
        for r in s.call.inputs:
            if ARGUMENT in r.flags:
                what = f"{r.slot} ({describe_row(r)})"
                notes.setdefault(what, []).append(s.call.key)
    return list(notes.items())


class _RankWalk:
    """The state of one walk through a rank's calls: what has been produced, what already differed."""

    def __init__(self, calls, working_u):
        self.working_u = working_u
        self.producers = _Producers()
        self.params = _parameter_index(calls)
        self.calls_by_key = {c.key: c for c in calls}
        self.diverged_keys = set()
        self.unmatched = []
        self.carriers = set()      # calls golden lacks whose inputs already differed: they pass it on
        self.carried = {}          # key of a call golden lacks -> the largest error its inputs carry
        self.fed_unrecorded = set()  # keys of calls golden lacks that read a value no recorded call made
        self.cancelled_values = set()  # value keys of outputs that cancelled to nearly zero
        self.mispaired = []        # keys of value-preserving calls paired with a different golden call
        self.reported = {}         # value key of a differing input already blamed -> that suspect's key
        self.entry_labels = {}     # value key of a parameter where error enters -> its label (the module
        #                            record lists it again: there too it introduces, not inherits)
        self.suspects = []
        self.suspect_by_key = {}
        self.idle = []             # changed arguments whose calls' outputs agree (CallSuspect.idle)
        self.golden_unpaired = frozenset()  # (base, direction) of golden calls left without a partner
        self.propagating = 0
        self.diverged = False      # a call introduced error beyond precision (a strong suspect)
        self.seen_nonfinite = False
        self.noise = 0.0           # largest error of an explained row so far
        self.last_matching = None  # the latest call whose rows all agree: error entered after it
        self.compared_rows = self.diverging_rows = 0

    def visit(self, call):
        if (call.short_api in VALUE_PRESERVING_APIS and any(r.is_tensor for r in call.rows)
                and not any(r.matched for r in call.rows if r.is_tensor)):
            for r in call.rows:  # only its scalar arguments found a partner: a view golden makes elsewhere
                r.matched = False
        mispaired = call.matched and self._mispaired(call)
        if mispaired:  # paired by call index with a different golden call: as good as unmatched
            for r in call.rows:
                r.matched = False
            self.mispaired.append(call.key)
        self.compared_rows += sum(1 for r in call.rows if r.matched)
        self.diverging_rows += sum(1 for r in call.rows if r.differs)
        if not call.matched:
            if not mispaired:
                self.unmatched.append(call.key)
            if any(self._fed_by_difference(r) for r in call.inputs):
                self.carriers.add(call.key)
            self.carried[call.key] = max((self._error_reaching(r) for r in call.inputs if r.is_tensor), default=0.0)
            if any(r.is_tensor and r.value_key() is not None and self.producers.find(r) is None for r in call.inputs):
                self.fed_unrecorded.add(call.key)  # e.g. a gradient autograd summed over several consumers
            for r in call.rows:
                r.label = MISPAIRED if mispaired else UNMATCHED
            self.producers.add(call, call.outputs)
            return
        op_model.mark_cancelled(call, self.calls_by_key, self.working_u, self.cancelled_values)
        if call.short_api in VALUE_PRESERVING_APIS and not any(r.differs for r in call.rows if r.is_tensor):
            for r in call.inputs:  # the same values laid out otherwise: other dims are no argument change
                if ARGUMENT in r.flags:
                    r.flags.discard(ARGUMENT)
                    r.error = 0.0
        div_in = [r for r in call.inputs if r.differs]
        div_out = [r for r in call.outputs if r.differs]
        if not div_in and not div_out:
            self.last_matching = call.key
            self._label_agreeing(call.rows)
            self.producers.add(call, call.outputs)
            return
        self.diverged_keys.add(call.key)
        inner = self._inner_producers(call, div_out)
        suspect = None if inner else self._classify(call, div_in, div_out)
        for key in inner:
            # A module's differing outputs are values a call inside it produced: that call is the
            # place to look (named already if it introduced the error), the module is context.
            if key in self.suspect_by_key:
                self.suspect_by_key[key].folded_modules.append(call.key)
        if suspect is not None and suspect.idle:
            self.diverged_keys.discard(call.key)
            self.idle.append(suspect)
            self._label_suspect(call, suspect)
        elif suspect is None:
            self.propagating += 1
            self._label_inherited(call, inner)
        else:
            self.suspects.append(suspect)
            self.suspect_by_key[call.key] = suspect
            for r in div_in:
                if r.value_key() is not None:
                    self.reported.setdefault(r.value_key(), call.key)
            self._label_suspect(call, suspect)
            self.diverged = self.diverged or suspect.tier != WEAK
        self.seen_nonfinite = self.seen_nonfinite or any(NONFINITE in r.flags for r in div_in + div_out)
        self.producers.add(call, call.outputs)

    # -- labels --------------------------------------------------------------------------------------

    def _label_agreeing(self, rows):
        for r in rows:
            if not r.matched:
                r.label = UNMATCHED
            elif r.cancelled:
                r.label = ROUNDING
            elif r.differs:
                r.label = INHERITS
                if r.role == "input" and self.entry_labels:
                    r.label = self.entry_labels.get(r.value_key(), INHERITS)
            else:
                r.label = ROUNDING if r.is_tensor and r.error > r.exact_floor else AGREES
            if (r.matched and r.is_tensor and math.isfinite(r.error) and r.label != AGREES and not r.cancelled
                    and not r.range_hidden):
                self.noise = max(self.noise, r.error)

    def _label_inherited(self, call, inner):
        self._label_agreeing(call.rows)
        if not any(r.differs for r in call.inputs):  # outputs within what rounding inside the call explains
            rounding = op_model.internal_rounding(call, self.calls_by_key, self.working_u)
            for r in call.outputs:
                if r.label == INHERITS and r.error <= rounding:
                    r.label = ROUNDING
        if inner:  # a module: its rows are its inner calls' rows
            for r in call.outputs:
                found = self.producers.find(r)
                if found is not None and found[1].label:
                    r.label = found[1].label

    def _label_suspect(self, call, suspect):
        self._label_agreeing(call.rows)
        mark = MARGINAL if suspect.tier == WEAK or suspect.idle else INTRODUCES
        for r in call.outputs:
            if r.differs:
                r.label = mark
        for r in call.inputs:
            if r.name in suspect.origins and suspect.origins[r.name].kind is not None:
                r.label = mark
                if suspect.origins[r.name].kind == PARAMETER and r.value_key() is not None:
                    self.entry_labels.setdefault(r.value_key(), mark)

    # -- explanations --------------------------------------------------------------------------------

    def _inner_producers(self, call, div_out):
        """For a module whose every differing output was produced by an earlier call: the keys of those
        calls (modules are recorded after the calls inside them); otherwise an empty list."""
        if not call.is_module or call.direction != "forward" or not div_out:
            return []
        keys = []
        for r in div_out:
            found = self.producers.find(r)
            if found is None or not found[0].matched or not found[1].differs:
                return []
            keys.append(found[0].key)
        return keys

    def _mispaired(self, call):
        """A cast, view or copy whose golden partner works on other values: the value entering it in
        the target is right (its producer agrees with golden, or carries no error through calls golden
        lacks) yet differs from what golden's call reads. Views and layouts that differ between two
        programs shift call indices, so index pairing lands on another call; its differing dims are no
        argument change either."""
        if call.short_api not in VALUE_PRESERVING_APIS:
            return False
        for r in call.inputs:
            if not (r.matched and r.is_tensor and r.differs):
                continue
            found = self.producers.find(r)
            if found is None:
                continue
            src_call, src_row = found
            carried = src_row.error if src_call.matched else self.carried.get(src_call.key, math.inf)
            if (not src_call.matched or not src_row.differs) and carried <= r.floor:
                return True
        return False

    def _error_reaching(self, row):
        """The error the target value of `row` carries from its producer (through calls golden lacks)."""
        found = self.producers.find(row)
        if found is None:
            return 0.0
        src_call, src_row = found
        if src_row.matched:
            return src_row.error if math.isfinite(src_row.error) else 0.0
        if not src_call.matched:
            return self.carried.get(src_call.key, 0.0)
        # an output golden's partner lacks (a cast golden makes without autograd): what its inputs carry
        return _max_error(r for r in src_call.inputs if math.isfinite(r.error))

    def _fed_by_difference(self, row):
        found = self.producers.find(row)
        return found is not None and found[1].differs

    def _origin_of(self, call, row):
        """Where one differing input row came from: an Origin (`kind` None when earlier work explains
        it)."""
        if ARGUMENT in row.flags:
            return Origin("a scalar argument with a different value", ARGUMENT_CHANGED, True)
        found = self.producers.find(row)
        if found is not None:
            src_call, src_row = found
            if not src_call.matched:
                carried = self.carried.get(src_call.key, 0.0)
                if src_call.key in self.fed_unrecorded:
                    # what unrecorded work carries reaches it, as it reaches a value read directly
                    carried = max(carried, self.noise)
                if (src_call.short_api in VALUE_PRESERVING_APIS and not row.flags
                        and (row.error <= AMPLIFICATION * carried + row.floor or (self.diverged and carried > 0))):
                    return Origin(f"output of {src_call.key} (a cast, view or copy golden lacks), carrying only "
                                  f"the error of its input", producer=src_call.key)
                if src_call.key in self.carriers:
                    return Origin(f"output of {src_call.key} (golden lacks it), computed from values already off",
                                  producer=src_call.key)
                base, direction, _ = naming.split_key(src_call.key)
                # parameter gradients are reduced outside recorded calls: what earlier values carry reaches them
                reach = max(carried, self.noise) if src_call.is_param_grad else carried
                # ... and the call may round to the working precision, as a paired one may
                if ((base, direction) in self.golden_unpaired and not row.flags
                        and row.error <= AMPLIFICATION * reach + max(row.floor, ROUNDING_UNITS * self.working_u)):
                    return Origin(f"output of {src_call.key}, left unpaired although golden calls it too (the two "
                                  f"call sequences align otherwise), carrying its input's error", producer=src_call.key)
                # where the target made it: the call has no golden partner to compare, its code line is the lead
                made = f" (made at {where})" if (where := stack_line(src_call.stack)) else ""
                if row.coarser and any(r.is_tensor and r.target_dtype == row.golden_dtype for r in src_call.inputs):
                    return Origin(f"output of {src_call.key}, which golden does not have, casting "
                                  f"{row.golden_dtype} to {row.target_dtype}{made}", FOREIGN_INPUT, True, src_call.key)
                return Origin(f"output of {src_call.key}, which golden does not have{made}", FOREIGN_INPUT, True,
                              src_call.key)
            if src_row.differs:
                return Origin(f"output of {src_call.key} (already off)", producer=src_call.key)
            if (not src_row.matched or src_call.short_api in VALUE_PRESERVING_APIS) and not row.flags:
                # an output golden's partner lacks, or a cast or view agreeing with its golden partner while
                # its consumer reads another value: the partner is another call (a cast golden makes
                # without autograd shifts backward indices). What reaches the call's inputs is what this
                # value can carry.
                reaching = max((max(r.error if r.matched and math.isfinite(r.error) else 0.0,
                                    self._error_reaching(r)) for r in src_call.inputs if r.is_tensor), default=0.0)
                if row.error <= AMPLIFICATION * reaching + row.floor:
                    return Origin(f"output of {src_call.key}, whose golden partner is another call, carrying its "
                                  f"input's error", producer=src_call.key)
            return Origin(f"output of {src_call.key}, which agrees with golden, yet golden's call reads another "
                          f"value here (another tensor is passed, or calls pair by index with other golden calls: "
                          f"try -fm)", FIRST_INPUT, _strong(row), src_call.key)
        value = row.value_key()
        param = (self.params.get(value) if value is not None else None) or op_model.parameter_slot(call, row)
        if row.is_parameter or param is not None:
            if value is not None and value in self.reported:
                return Origin(f"{param or 'a parameter'}, already found differing at {self.reported[value]}")
            return Origin(param or "a parameter", PARAMETER, _strong(row))
        after = f"; it entered after {self.last_matching}" if self.last_matching else ""
        if NONFINITE in row.flags and not self.seen_nonfinite:
            return Origin(f"inf/nan that no recorded call produced{after}", FIRST_INPUT, True)
        if self.diverged:
            return Origin("not produced by a recorded call; earlier calls already diverge")
        if self.noise > 0 and not row.flags:
            if row.error <= AMPLIFICATION * self.noise:
                return Origin(f"not produced by a recorded call; earlier values already differ by up to "
                              f"{self.noise:.2g}, which unrecorded work carries")
            negligible = op_model.negligible_in_sum(call, row, self.calls_by_key, self.noise)
            if negligible is not None:
                row.cancelled = True  # its error relative to itself means nothing (not a noise level)
                return Origin(f"not produced by a recorded call; it is added in, and its difference is "
                              f"{negligible:.2g} of the sum's size (it cancels to nearly zero, e.g. a bias "
                              f"gradient), which earlier differences carry")
        if call.direction == "backward":
            return Origin(f"a gradient no recorded backward produced (an unrecorded backward ran in "
                          f"between, e.g. a custom autograd Function){after}", FIRST_INPUT, _strong(row))
        return Origin(f"not produced by any recorded call (model input or untracked computation){after}",
                      FIRST_INPUT, _strong(row))

    def _hidden_input_error(self, call):
        """Backward calls also read tensors saved in forward; parameter gradients are reduced or
        accumulated outside recorded calls. The error those hidden inputs may carry (inf: unknown, but
        earlier differences may reach them), or None when they cannot differ."""
        if call.is_param_grad:
            return math.inf if (self.noise > 0 or self.diverged) else None
        fwd = naming.forward_of(call.key) if call.direction == "backward" else None
        if fwd not in self.diverged_keys:
            return None
        return max(_max_error(self.calls_by_key[fwd].rows), 0.0) if fwd in self.calls_by_key else math.inf

    def _classify(self, call, div_in, div_out):
        """The CallSuspect this differing call is, or None when its difference only propagates."""
        in_err = _max_error(call.inputs)
        judged = op_model.judged_outputs(call)
        out_err = _max_error(judged)
        out_floor = max(max((r.floor for r in judged), default=0.0),
                        op_model.internal_rounding(call, self.calls_by_key, self.working_u))
        hidden = self._hidden_input_error(call)
        carried = max(in_err, hidden or 0.0)
        if carried > 0 and op_model.switches(call, self.calls_by_key):
            # single elements crossed the threshold: what the tensor as a whole carries is its error
            for r in judged:
                if not r.flags - {DTYPE}:
                    r.error = r.l2_error
            out_err = _max_error(judged)
        grown = max(op_model.amplification(call, self.calls_by_key) * carried,
                    op_model.summed_error(call, judged, self.calls_by_key))
        expected = grown + max(out_floor, 1e-30)
        ratio = out_err / expected if math.isfinite(out_err) and math.isfinite(expected) else (
            0.0 if not math.isfinite(expected) else math.inf)
        origins, unexplained = {}, []
        for r in div_in:
            origins[r.name] = origin = self._origin_of(call, r)
            if origin.kind is not None:
                unexplained.append((r, origin))

        def make(kind, tier, reason):
            return CallSuspect(call=call, kind=kind, tier=tier, input_error=carried, output_error=out_err,
                           amplification=ratio, reason=reason, origins=origins)

        finite_inputs = all(r.target_finite for r in call.inputs if r.is_tensor)
        new_nonfinite = [r for r in div_out if NONFINITE in r.flags and not r.target_finite]
        if new_nonfinite and finite_inputs and hidden is None:
            r = new_nonfinite[0]
            golden = "golden finite" if r.golden_finite else "golden's inf/nan sit elsewhere"
            return make(OVERFLOW, STRONG, f"inputs are finite but {short_name(r.name)} holds inf/nan ({golden})")
        if unexplained:
            r, origin = max(unexplained, key=lambda u: (u[1].strong, bool(u[0].flags), u[0].error))
            suspect = make(origin.kind, STRONG if origin.strong else WEAK,
                           f"{short_name(r.name)} differs ({describe_row(r)}) and is {origin.text}")
            # only arguments changed, and the outputs are what the inputs and rounding explain
            suspect.idle = (all(o.kind == ARGUMENT_CHANGED for _, o in unexplained) and ratio <= 1
                            and not any(o.flags for o in div_out))
            return suspect
        if hidden is not None and not math.isfinite(hidden):
            return None  # parameter gradients, or a backward whose forward's error is unknown
        tensors = [r for r in call.inputs if r.is_tensor]
        if any(r.inside for r in tensors) and not any(r.matched for r in tensors):
            return None  # it reads only values golden holds inside one call (nn.Dense's MatMul output)
        flagged = [r for r in div_out if r.flags - {NONFINITE}]
        inputs_agree = not div_in and hidden is None
        if inputs_agree and not any(r.is_tensor for r in call.inputs) and (self.noise > 0 or self.diverged):
            return None  # inputs not dumped (data_mode) or none: earlier differences may reach it
        if inputs_agree and _is_communication(call.key) and (ratio > 1 or flagged):
            return make(RECEIVED, COMM, "a collective returns values that differ although this rank sent "
                                        "matching ones: another rank diverged")
        if _is_communication(call.key):
            return None
        if inputs_agree and flagged:
            r = flagged[0]
            return make(INTRODUCED, STRONG, f"inputs match but {short_name(r.name)} differs ({describe_row(r)})")
        cast = op_model.cast_rounding(call, self.working_u)
        if cast is not None:
            r, own = cast
            return make(INTRODUCED, STRONG, f"it rounds its input to {r.target_dtype}: {short_name(r.name)} moves by "
                                            f"{own:.2g} of its own input, {own / self.working_u:.0f}x the "
                                            f"working precision's unit roundoff")
        if ratio > INTRODUCED_RATIO:
            r = max(judged, key=lambda x: x.error)
            precision = " (more than rounding explains)" if self.working_u else ""
            if inputs_agree:
                return make(INTRODUCED, STRONG, f"inputs match but {short_name(r.name)} differs ({describe_row(r)})"
                                                f"{precision}")
            return make(AMPLIFIED, AMPLIFYING, f"inputs are off by at most {carried:.2g} but {short_name(r.name)} by "
                                               f"{r.error:.2g}, {ratio:.0f}x what they and rounding explain")
        if ratio > 1 and inputs_agree:
            r = max(judged, key=lambda x: x.error)
            return make(INTRODUCED, WEAK, f"inputs match but {short_name(r.name)} differs ({describe_row(r)})")
        return None


def _strong(row):
    """An unexplained input counts as strong when a flag says so or it is well past its floor."""
    return bool(row.flags) or row.error >= STRONG_OVER_FLOOR * max(row.floor, 1e-30)

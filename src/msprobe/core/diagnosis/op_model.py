"""What one call may do to the error it is given, by the kind of op it is: how much it may grow its
inputs' relative error, which of its outputs are sums of its inputs (and so may cancel), whether a cast
rounds below the working precision, which arguments hold parameters. Per call, from its rows; the walk
through a rank's calls is `flow.py`. Must not import torch or mindspore.
"""
from __future__ import annotations

import math

from msprobe.core import naming
from msprobe.core.diagnosis.errors import row_error, unit_roundoff
from msprobe.core.diagnosis.thresholds import (ADDITIVE_APIS, AMPLIFICATION, CAST_APIS, INTRODUCED_RATIO,
                                               PARAMETER_SLOTS, PIECE_APIS, PIECE_BACKWARD_APIS, RANGE_AMPLIFICATION,
                                               RANGE_APIS, RECURRENT_APIS, ROUNDING_UNITS, THRESHOLD_APIS,
                                               VALUE_PRESERVING_APIS)

# float32's unit roundoff: outputs this much smaller than their inputs are cancellations even there
_FP32_U = 2.0 ** -24


def short_api(call):
    """'linear' of Functional.linear.0.forward, 'softmax' of Functional.nn.softmax...: the last part."""
    return call.short_api


def _module_class(call):
    """'ReLU' of Module.ff.1.ReLU.backward.0: a module is the op its class names (nn.ReLU switches
    like relu does); None for other calls."""
    if not call.is_module or call.is_param_grad:
        return None
    return naming.module_class(call.key)


def _op(call, calls_by_key):
    """(API name, the rows it reads) of a call; a backward reads what its forward read (and a module's
    backward, which has no API name, takes its forward's)."""
    name = short_api(call) or _module_class(call)
    if call.direction == "backward":
        fwd = calls_by_key.get(naming.forward_of(call.key) or "")
        if fwd is not None:
            return name or short_api(fwd), fwd.inputs
    return name, call.inputs


def amplification(call, calls_by_key):
    """How much this call may grow the relative error of its inputs: casts, views and copies not at
    all, pieces of an input by their size (`piece_growth`); exp-like ops with their input's range
    (d exp(x) / exp(x) = dx); others up to AMPLIFICATION."""
    name, reads = _op(call, calls_by_key)
    if _takes_pieces(call, name):
        return piece_growth(call)
    if name in VALUE_PRESERVING_APIS:
        return 1.0
    if name in RANGE_APIS:
        scale = max((r.golden_scale for r in reads if r.matched and r.is_tensor), default=0.0)
        return AMPLIFICATION + RANGE_AMPLIFICATION * scale
    return AMPLIFICATION


def _takes_pieces(call, name):
    return name in (PIECE_BACKWARD_APIS if call.direction == "backward" else PIECE_APIS)


def piece_growth(call):
    """How much a call that hands on pieces of its input may grow the input's relative error. A piece
    keeps each element's absolute error, but the error is measured against the piece's own range and
    norm, which may be smaller: the whole's size over the piece's. In statistics mode the piece's
    max, min and mean are other elements than the whole's, whose error the whole's statistics only
    bound from below: any op's AMPLIFICATION on top. Tensor mode measures every element (MaxAbsErr,
    EucDist): the size ratio alone."""
    whole = [r for r in call.inputs if r.matched and r.is_tensor and unit_roundoff(r.golden_dtype)]  # not indices
    pieces = [r for r in call.outputs if r.matched and r.is_tensor]
    if not whole or not pieces:
        return 1.0
    range_in = max(r.golden_scale for r in whole)
    norm_in = max(_golden_norm(r) for r in whole)
    ratio = 1.0
    for r in pieces:
        if r.golden_scale > 0:
            ratio = max(ratio, range_in / r.golden_scale)
        if _golden_norm(r) > 0:
            ratio = max(ratio, norm_in / _golden_norm(r))
    element_wise = all(r.tensor_metrics and any(math.isfinite(m) for m in r.tensor_metrics)
                       for r in whole + pieces)
    return ratio if element_wise else AMPLIFICATION * ratio


def _golden_norm(row):
    norm = row.golden[3] if len(row.golden) > 3 else None
    return abs(norm) if type(norm) is float and math.isfinite(norm) else 0.0


def internal_rounding(call, calls_by_key, working_u):
    """The error a computing call's outputs may carry from rounding inside it to the run's working
    precision, whatever dtype it hands back (autocast runs a GRU in bf16 and returns float32): a few
    unit roundoffs, times the square root of the rounding steps a value travels in the call (a
    recurrent op's time steps: independent roundings add up as a random walk). 0.0 without a working
    precision or for casts, views and copies."""
    name, reads = _op(call, calls_by_key)
    if not working_u or name in VALUE_PRESERVING_APIS:
        return 0.0
    return ROUNDING_UNITS * working_u * math.sqrt(recurrent_steps(name, reads))


def recurrent_steps(name, reads):
    """The time steps one call of a recurrent op runs (an upper bound: batch-first or not, the longer
    of the leading dims of its input sequence); 1 for other ops."""
    if name not in RECURRENT_APIS:
        return 1
    dims = next((r.dims for r in reads if r.is_tensor and r.role == "input"), ())
    if len(dims) >= 3:
        return max(dims[0], dims[1])
    return dims[0] if len(dims) == 2 else 1


def switches(call, calls_by_key):
    """The call's output switches branch at a threshold (relu and its backward, max-pool ...): judged by
    its L2 error, not its element-wise maximum one."""
    return _op(call, calls_by_key)[0] in THRESHOLD_APIS


def sum_slots(call, calls_by_key):
    """Slots of a call's outputs that are sums of its inputs: all of an additive op's (forward or
    backward), and a backward's bias gradient (the sum of its output gradients)."""
    name, _ = _op(call, calls_by_key)
    if name in ADDITIVE_APIS:
        return {r.slot for r in call.outputs}
    if call.direction == "backward":
        return {slot for slot, param in PARAMETER_SLOTS.get(name or "", {}).items() if param == "bias"}
    return set()


def summed_error(call, judged, calls_by_key):
    """For a sum (an additive op, forward or backward): the error its inputs' absolute errors add up
    to, relative to the output's size (first-order error propagation; a cancelled input counts with its
    absolute error, which is small however large its relative one). 0.0 for other calls."""
    if not judged or not sum_slots(call, calls_by_key) >= {r.slot for r in judged}:
        return 0.0
    absolute = sum(r.error * r.golden_scale for r in call.inputs if r.matched and r.is_tensor
                   and math.isfinite(r.error))
    scale = max(r.golden_scale for r in judged)
    return absolute / scale if scale > 0 else 0.0


def mark_cancelled(call, calls_by_key, working_u, cancelled_values):
    """Mark sums that cancelled to (numerically) zero, far below the inputs they add up (a bias gradient
    that is zero in exact arithmetic): the rounding of the inputs is all they hold, so their error
    relative to themselves means nothing. The same values recorded again later (`cancelled_values`,
    value keys, updated here) are marked too."""
    if not cancelled_values and not any(r.differs for r in call.outputs):
        return  # nothing differs, nothing recorded before cancelled: nothing to mark
    u = max(working_u, _FP32_U)
    # an input with no golden counterpart (inside a fused golden call) still tells the sum's size
    scale_in = max((r.golden_scale if r.matched else r.target_scale for r in call.inputs if r.is_tensor),
                   default=0.0)
    sums = sum_slots(call, calls_by_key)
    for r in call.inputs:
        r.cancelled = r.matched and not r.flags and r.value_key() in cancelled_values
    numel_in = max((r.numel or 0 for r in call.inputs if r.is_tensor), default=0)
    for r in call.outputs:
        value = r.value_key()
        # a sum of k terms rounds by up to k units of its largest term (a bias gradient sums a batch)
        terms = max(1.0, numel_in / r.numel) if r.numel else 1.0
        r.cancelled = r.matched and r.is_tensor and not r.flags and (
            (r.slot in sums and r.golden_scale < terms * u * scale_in) or value in cancelled_values)
        if r.cancelled and value is not None:
            cancelled_values.add(value)


def judged_outputs(call):
    """Output rows whose error means something (see `mark_cancelled`, `Row.range_hidden`)."""
    return [r for r in call.outputs if r.matched and r.is_tensor and not r.cancelled and not r.range_hidden]


def negligible_in_sum(call, row, calls_by_key, noise):
    """For an input added into a sum (an optimizer's `param.add_(grad)` ...): its absolute error over
    the sum's size, when that is within what rounding and earlier differences (`noise`) explain; else
    None."""
    outs = [r for r in call.outputs if r.matched and r.is_tensor]
    if not outs or not sum_slots(call, calls_by_key) >= {r.slot for r in outs}:
        return None
    scale = max(r.golden_scale for r in outs)
    if scale <= 0 or not math.isfinite(row.error):
        return None
    share = row.error * row.golden_scale / scale
    return share if share <= AMPLIFICATION * noise + max(r.floor for r in outs) else None


def cast_rounding(call, working_u):
    """(output row, its error against the target's own input) of a cast that rounds beyond the working
    precision, else None. Measured within the target run, so noise the input already carries does not
    hide it."""
    if not working_u or short_api(call) not in CAST_APIS:
        return None
    ins = [r for r in call.inputs if r.is_tensor]
    outs = [r for r in call.outputs if r.is_tensor and r.matched and r.coarser]
    if len(ins) != 1 or len(outs) != 1 or ins[0].numel != outs[0].numel:
        return None
    own, _ = row_error(outs[0].target, ins[0].target)
    return (outs[0], own) if own > INTRODUCED_RATIO * working_u else None


def parameter_slot(call, row):
    """'the weight argument of Functional.linear (a parameter)' at level L1, where weights have no
    record of their own; None for other rows."""
    if call.direction != "forward" or call.is_module or not row.is_tensor:
        return None
    name = PARAMETER_SLOTS.get(short_api(call) or "", {}).get(row.slot)
    return f"the {name} argument of {naming.split_key(call.key)[0]} (a parameter)" if name else None

"""Judge one API call: metrics and both verdicts for every compared tensor, then the API's row.
Must not import torch or mindspore.
"""

import math

import numpy as np

from msprobe.core.acc_check.input_spec import iter_tensor_specs, spec_tree
from msprobe.core.acc_check.reduction import backward_reduction_length, forward_reduction_length
from msprobe.core.acc_check.results import ApiResult, DetailRow, combine
from msprobe.core.acc_check.output_errors import OutputErrors, measure_errors
from msprobe.core.acc_check.verdict import ERROR, PASS, SKIP, dtype_status, seed_status


def _shapes(tree_value):
    try:
        return [s.shape for _, s in iter_tensor_specs(spec_tree(tree_value))]
    except Exception:  # an unreadable record has been reported by the executor already
        return []


def judge(case, run):
    """ApiResult of an ApiCase from the executor's CaseRun."""
    fwd = case.forward
    in_shapes = _shapes([fwd.get("input_args", []), fwd.get("input_kwargs", {})])
    out_shapes = _shapes(fwd.get("output", []))
    fwd_rms, bwd_rms = _input_rms(run.inputs, "forward."), _input_rms(run.inputs, "backward.")
    fwd_rows = [_row(c, forward_reduction_length(case.api, in_shapes, c.tested.shape), fwd_rms)
                for c in run.forward]
    bwd_rows = [_row(c, backward_reduction_length(case.api, in_shapes, out_shapes, c.tested.shape), bwd_rms)
                for c in run.backward or ()]
    details = fwd_rows + bwd_rows
    messages = []
    if run.forward_skip:
        forward, forward_dtype = SKIP, SKIP
        messages.append(run.forward_skip)
    else:
        forward = combine(r.status for r in fwd_rows) or SKIP
        forward_dtype = combine(r.dtype_status for r in fwd_rows) or SKIP
        if not fwd_rows:
            messages.append("forward: no tensor output to compare")
    if run.backward is None and not run.backward_skip:
        backward = backward_dtype = ""
    elif run.backward_skip:
        backward = backward_dtype = SKIP
        if run.backward_skip != run.forward_skip:
            messages.append(f"backward: {run.backward_skip}")
    else:
        backward = combine(r.status for r in bwd_rows) or SKIP
        backward_dtype = combine(r.dtype_status for r in bwd_rows) or SKIP
        if not bwd_rows:
            messages.append("backward: no floating-point input gradient to compare")
    for r in details:
        if r.status == ERROR:
            messages.append(f"{r.api_name[len(case.name) + 1:]}: cosine {r.cosine:.6g}, max abs err "
                            f"{r.max_abs_err:.3g}" + (f" ({r.message})" if r.message else ""))
    worst = min(details, key=badness, default=None)
    return ApiResult(case.name, forward, backward, "; ".join(messages), forward_dtype, backward_dtype, details, worst)


def _row(compared, reduction_length, input_rms):
    if compared.identical and compared.tested.size > 1:
        # Equal element for element: what measure_errors would say, without its float64 passes.
        e = OutputErrors(cosine=1.0, max_abs_err=0.0, max_rel_err=0.0, ulp_err=0.0)
    else:
        e = measure_errors(compared.tested, compared.bench, compared.dtype, reduction_length, input_rms)
    status, note = seed_status(e)
    message = "; ".join(x for x in (compared.message, note) if x)
    return DetailRow(compared.name, compared.bench_dtype, compared.tested_dtype, tuple(compared.tested.shape),
                     e.cosine, e.max_abs_err, e.max_rel_err, status, message, e.ulp_err, reduction_length,
                     dtype_status(e.ulp_err, compared.dtype))


def _input_rms(inputs, prefix):
    """The largest RMS among the floating arrays fed to one direction of the call (finite part)."""
    best = 0.0
    for key, a in inputs.items():
        if not key.startswith(prefix) or a.dtype.kind != "f" or a.size == 0:
            continue
        flat = a.reshape(-1)
        if flat.dtype.itemsize < 4:
            flat = flat.astype(np.float32)
        sq = float(np.dot(flat, flat))  # BLAS dot in the array's own precision: plenty for a scale
        if not math.isfinite(sq):
            flat = flat[np.isfinite(flat)].astype(np.float64)
            sq = float(np.dot(flat, flat)) if flat.size else 0.0
        best = max(best, math.sqrt(sq / a.size))
    return best


def badness(row):
    """Sort key: erroring rows first, then lower cosine, then larger absolute error."""
    cos = row.cosine if not math.isnan(row.cosine) else -2.0
    err = row.max_abs_err if not math.isnan(row.max_abs_err) else math.inf
    return (row.status == PASS, cos, -err)

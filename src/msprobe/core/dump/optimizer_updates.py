"""The optimizer step as one record per parameter update, in both frameworks:

    Optimizer.{OptimizerClass}.{parameter name}.{n}.forward
        input_args: [the parameter before the step, its gradient]      output: [the parameter after]

`n` counts the updates of that parameter by that optimizer in the step (0 for one step per step). The
names pair across frameworks: MindSpore's parameter names and optimizer classes are mapped to PyTorch's
by compare (data/ms_to_pt_cells.yaml), so a weight-decay or learning-rate difference on one parameter is
an output that differs where the inputs agree: the diagnosis names the optimizer's update of it.

The adapters call `begin` before the optimizer runs (with its parameters and their gradients) and
`end` after it; calls the optimizer makes meanwhile are the adapter's to nest or not. Framework-free.
"""

from msprobe.core import naming
from msprobe.core.stack import capture_stack


def begin(session, optimizer_class, updates):
    """Input records of every update `(parameter name, parameter, gradient)` before the optimizer
    changes the parameters; returns the open frames for `end`."""
    frames = []
    gate = session.gate
    calls = session.calls
    parent = session.parent_key()
    # every update is made at the same place: one stack for all of them
    stack = capture_stack() if session.with_stack else None
    flt = session.filter
    # `Optimizer.{Class}.{parameter}.{n}.forward` (naming.optimizer_update_key), counted per parameter
    counted = f"{naming.OPTIMIZER_PREFIX}.{optimizer_class}"
    next_key = session.counter.next_api_key
    if flt.passes_everything and updates:
        flt.hit = True  # (want_call's answer for every update, without its frame)
    if session.plain_calls:  # (every update recorded, whole)
        frames = _plain_begin(session, [next_key(counted, name) for name, _, _ in updates], parent, stack, updates)
    else:
        for name, param, grad in updates:
            key = next_key(counted, name)
            if not flt.passes_everything and not flt.want_call(key, session.module_stack):
                continue
            if gate is not None and gate.exhausted:
                continue
            frame, _ = calls.begin(session, key, parent, (param, grad), {}, module=False, backward=False,
                                   stack=stack)
            frames.append((frame, param, grad))
    if frames:
        # the summaries of the values before the step go before the optimizer changes them: in one batch,
        # not one launch per parameter
        calls.ops.before_mutation(session, [x for _, p, g in frames for x in (p, g)], {})
    return frames


def end(session, frames):
    """The records of `begin`'s frames, with each parameter as the optimizer left it."""
    calls = session.calls
    if frames:
        # the parameters changed in place: statistics cached for them are stale
        calls.ops.before_mutation(session, [p for _, p, _ in frames], {})
    if frames and type(frames[0][0]) is _Update:
        _plain_end(session, frames)
        return
    for frame, param, _ in frames:
        calls.end(session, frame, param, (param,))


class _Update:
    """An update record begun where the session's calls are plain (`_plain_begin`)."""

    __slots__ = ("key", "in_args", "parent", "stack")

    def __init__(self, key, in_args, parent, stack):
        self.key, self.in_args, self.parent, self.stack = key, in_args, parent, stack


def _plain_begin(session, keys, parent, stack, updates):
    """`begin`'s frames where a call's records are its values' summaries alone (`session.plain_calls`):
    the input records CallCapture.begin would make, without its frames, in one stretch of tool work."""
    frames = []
    with session.calls.ops.work():
        for key, (_, param, grad) in zip(keys, updates):
            in_args, _ = session.args_records(key, (param, grad), {}, "input", False, [])
            frames.append((_Update(key, in_args, parent, stack), param, grad))
    return frames


def _plain_end(session, frames):
    """`end` of `_plain_begin`'s frames: each parameter's output record, and the record emitted."""
    amend = session.calls.ops.amend_outputs
    with session.calls.ops.work():
        for update, param, _ in frames:
            outs = session.outputs_record(update.key, param, False, [])
            if amend is not None:
                amend(session, outs)
            session.emit(update.key, {"input_args": update.in_args, "input_kwargs": {}, "output": outs}, [], outs,
                         None, update.parent, update.stack)

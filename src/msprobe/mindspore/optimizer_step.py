"""The optimizer step of a PyNative training loop (`optimizer(grads)`) as one record per parameter
update (core/dump/optimizer_updates.py) instead of one `Jit.{Class}` record of the incoming gradients.

`mindspore.nn.Optimizer.__call__` is wrapped while capture is on at L1/mix: every optimizer is a Cell
called with the gradients in the order of its `parameters`. What the optimizer runs inside (its
jit-compiled construct) is nested, not recorded.
"""

import mindspore as ms

from msprobe.core.dump import optimizer_updates
from msprobe.mindspore import _state

_ORIGINAL = "__msprobe_original__"


def _call(orig):
    def call(optimizer, *args, **kwargs):
        session = _state.session
        if session is None or not _state.recording or _state.busy or _state.depth:
            return orig(optimizer, *args, **kwargs)
        grads = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else None
        params = tuple(optimizer.parameters)
        if grads is None or len(grads) != len(params):  # not the usual optimizer(grads): one API record
            return session.record_call("Jit", type(optimizer).__name__, lambda *a, **k: orig(optimizer, *a, **k),
                                       args, kwargs)
        calls = session.calls
        session.before_optimizer()
        frames = optimizer_updates.begin(session, type(optimizer).__name__,
                                         [(p.name, p, g) for p, g in zip(params, grads)])
        if not frames:  # begin read nothing: what the backward pass queued is read before the step
            session.before_mutation()
        out = calls.ops.run(lambda *a, **k: orig(optimizer, *a, **k), args, kwargs)
        optimizer_updates.end(session, frames)
        return out
    setattr(call, _ORIGINAL, orig)
    return call


def install():
    """Wrap nn.Optimizer.__call__ (once; later calls find it wrapped)."""
    cls = ms.nn.Optimizer
    current = cls.__dict__.get("__call__")
    if current is not None and hasattr(current, _ORIGINAL):
        return
    cls.__call__ = _call(ms.nn.Cell.__call__ if current is None else current)


def uninstall():
    cls = ms.nn.Optimizer
    current = cls.__dict__.get("__call__")
    if current is None or not hasattr(current, _ORIGINAL):
        return
    orig = getattr(current, _ORIGINAL)
    if orig is ms.nn.Cell.__call__:
        del cls.__call__
    else:
        cls.__call__ = orig

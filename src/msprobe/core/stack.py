"""Cheap call-stack capture for stack.json: a frame walk, no `inspect.stack()` (which reads source
files on every call). Source lines are looked up only when stack.json is written.

Consecutive captures mostly share their outer frames (every API call inside one `forward` has the
same callers), so each thread remembers the chain it last walked: a capture walks only the frames
that are new, up to the first remembered frame that is still running, and reuses what lies beyond.
That is exact: a plain function's frame object belongs to one invocation, and while it runs, every
frame outside it stays suspended in the same call (a generator frame can be resumed from elsewhere,
so it is never the point of reuse). The remembered frames are held until the next capture in that
thread or `release_frames()`.

Must not import torch or mindspore.
"""

import os
import sys
import threading

_SKIP_DIRS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)  # msprobe itself
_RESUMABLE = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR

_local = threading.local()


class _Chain:
    """The frames of one thread's last capture, msprobe's own left out: `frames[d]` is the `d`-th
    frame below the root;
    `known` maps id(frame) -> (frame, its depth, the entries outside it)."""

    __slots__ = ("frames", "known", "skip_dirs")

    def __init__(self, skip_dirs):
        self.frames, self.known, self.skip_dirs = [], {}, skip_dirs


def capture_stack(skip_dirs=_SKIP_DIRS, limit=30):
    """(filename, lineno, function) tuples from the caller outward, msprobe's own frames left out."""
    chain = getattr(_local, "chain", None)
    if chain is None or chain.skip_dirs != skip_dirs:
        chain = _local.chain = _Chain(skip_dirs)
    known, frames = chain.known, chain.frames
    frame = sys._getframe(1)
    walked = []  # frames new to the chain, innermost first; skipped (msprobe's own) frames are no part of it
    depth, outer = -1, ()
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(skip_dirs):
            frame = frame.f_back
            continue
        hit = known.get(id(frame))
        walked.append(frame)
        if hit is not None and hit[0] is frame and not code.co_flags & _RESUMABLE:
            _, depth, outer = hit  # its own line may have moved on: its entry is made afresh
            depth -= 1
            break
        frame = frame.f_back
    # frames below the point of reuse belonged to calls that have returned: forget them
    if len(frames) > depth + 1:
        for gone in frames[depth + 1:]:
            known.pop(id(gone), None)
        del frames[depth + 1:]
    for frame in reversed(walked):  # outermost first: each learns the entries outside it
        depth += 1
        known[id(frame)] = (frame, depth, outer)
        frames.append(frame)
        code = frame.f_code
        outer = ((code.co_filename, frame.f_lineno, code.co_name),) + outer
    return outer[:limit]


def release_frames():
    """Forget this thread's remembered frames (and the locals they keep alive): at step end."""
    _local.chain = None

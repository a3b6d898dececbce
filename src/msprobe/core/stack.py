"""Cheap call-stack capture for stack.json: a frame walk, no `inspect.stack()` (which reads source
files on every call). Source lines are looked up only when stack.json is written.

Must not import torch or mindspore.
"""

import os
import sys

_SKIP_DIRS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)  # msprobe itself


def capture_stack(skip_dirs=_SKIP_DIRS, limit=30):
    """(filename, lineno, function) tuples from the caller outward, msprobe's own frames left out."""
    frame = sys._getframe(1)
    out = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        fn = code.co_filename
        if not fn.startswith(skip_dirs):
            out.append((fn, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return tuple(out)

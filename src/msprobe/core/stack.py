"""Cheap call-stack capture for stack.json: a frame walk (in C where msprobe._frames is built), no
`inspect.stack()` (which reads source files on every call). A frame is noted as (id of its code
object, its instruction offset): cheap to take and to hash. Line numbers (a search of the code's line table) and source lines are looked up
once per distinct stack (`frame_lines`, `stack_texts`).

Must not import torch or mindspore.
"""

import linecache
import os
import sys

try:  # the same walk in C (Python 3.11+): a frame costs no bytecode round
    from msprobe._frames import walk as _walk
except ImportError:  # not built, or an older Python
    _walk = None

_SKIP_DIRS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)  # msprobe itself

# id(code) -> code for every code object a captured stack names: kept alive, so ids stay unique
_CODES = {}
_KEEP = {}  # skip_dirs -> {id(code): whether its frames are shown (not in skip_dirs)}
_LINES = {}  # (id(code), offset) -> line number
# captured stack -> its stack.json lines: a training loop captures the same stacks every step
_TEXTS = {}
_TEXTS_LIMIT = 1 << 16


STACK_LIMIT = 30  # frames kept in a captured stack


def capture_stack(skip_dirs=_SKIP_DIRS, limit=STACK_LIMIT):
    """The stack from the caller outward, msprobe's own frames left out: a tuple of
    (id(code), instruction offset) entries; `frame_lines` turns them into (filename, lineno, function)."""
    keeps = _KEEP.get(skip_dirs)
    if keeps is None:
        keeps = _KEEP[skip_dirs] = {}
    if _walk is not None:
        got = _walk(sys._getframe(1), keeps, limit)
        if got is not None:  # None: a code object not seen yet (the Python walk notes it)
            return got
    return walk_python(sys._getframe(1), keeps, skip_dirs, limit)


def default_walk():
    """(the C walk or None, its `keeps` table, the limit) of `capture_stack()`: for a caller in C that walks
    from the frame it is called from (msprobe._call), then falls back on `capture_stack()`."""
    return _walk, _KEEP.setdefault(_SKIP_DIRS, {}), STACK_LIMIT


def walk_python(frame, keeps, skip_dirs, limit):
    """capture_stack's walk from `frame` outward; notes every code object it meets in `keeps`
    (id -> shown) and `_CODES`."""
    out = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        cid = id(code)
        keep = keeps.get(cid)
        if keep is None:
            keep = keeps[cid] = not code.co_filename.startswith(skip_dirs)
            _CODES[cid] = code
        if keep:
            out.append((cid, frame.f_lasti))
        frame = frame.f_back
    return tuple(out)


def frame_lines(stack):
    """(filename, lineno, function) for each entry of a captured stack; entries that are already
    such triples pass through."""
    out = []
    for entry in stack:
        if len(entry) == 3:
            out.append(entry)
            continue
        code = _CODES[entry[0]]
        line = _LINES.get(entry)
        if line is None:
            line = _LINES[entry] = _line_of(code, entry[1])
        out.append((code.co_filename, line, code.co_name))
    return out


def stack_texts(stack):
    """The stack.json lines of a captured stack ("File {file}, line {n}, in {function}, \\n {source}"),
    made once per distinct stack in the process, not once per step."""
    texts = _TEXTS.get(stack)
    if texts is None:
        if len(_TEXTS) >= _TEXTS_LIMIT:  # a program whose stacks never repeat: do not grow forever
            _TEXTS.clear()
        texts = _TEXTS[stack] = tuple(
            f"File {fn}, line {ln}, in {name}, \n {linecache.getline(fn, ln).strip()}"
            for fn, ln, name in frame_lines(stack))
    return texts


def _line_of(code, offset):
    if hasattr(code, "co_lines"):  # Python 3.10+
        for start, end, line in code.co_lines():
            if start <= offset < end:
                return line if line is not None else code.co_firstlineno
        return code.co_firstlineno
    import dis  # Python 3.9: line starts only
    line = code.co_firstlineno
    for start, start_line in dis.findlinestarts(code):
        if start > offset:
            break
        line = start_line
    return line


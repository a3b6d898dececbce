"""capture_stack notes (code, instruction offset) pairs; resolved to (file, line, function) they must
always equal the plain definition of the stack."""

import linecache
import sys
import threading

from msprobe.core.stack import _SKIP_DIRS, capture_stack, frame_lines


def full_walk(limit=30, skip_dirs=_SKIP_DIRS):
    """The plain definition: every frame from the caller outward, msprobe's own left out."""
    out, frame = [], sys._getframe(1)
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if not code.co_filename.startswith(skip_dirs):
            out.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return tuple(out)


def both():
    got, want = capture_stack(), full_walk()
    got = tuple(frame_lines(got))
    assert got == want
    return got


def test_calls_in_one_frame_see_its_line_move_on():
    first = both()
    second = both()
    assert first[1][0] == second[1][0] and first[1][1] != second[1][1]  # same caller, next line


def test_nested_and_recursive_calls_return_and_go_deeper():
    def down(n):
        both()
        if n:
            down(n - 1)
        both()

    for _ in range(3):
        down(4)
        both()


def test_generator_resumed_from_different_callers():
    def gen():
        while True:
            both()
            yield

    g = gen()

    def caller_a():
        next(g)

    def caller_b():
        next(g)

    for _ in range(3):
        caller_a()
        caller_b()
        next(g)


def test_threads_keep_their_own_chains():
    errors = []

    def work():
        try:
            for _ in range(200):
                both()
        except AssertionError as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(200):
        both()
    for t in threads:
        t.join()
    assert not errors


def test_limit():
    def deep(n):
        if n:
            return deep(n - 1)
        got, want = capture_stack(limit=5), full_walk(limit=5)
        assert tuple(frame_lines(got)) == want
        return capture_stack()

    assert len(deep(40)) == 30
    both()


def test_skipped_frames_between_user_frames():
    """A skipped frame (a library's wrapper) between two user frames is left out."""
    skip = _SKIP_DIRS + ("/skipped-lib/",)
    space = {}
    exec(compile("def wrapper(f):\n    return f()\n", "/skipped-lib/wrap.py", "exec"), space)

    def leaf():
        got, want = capture_stack(skip_dirs=skip), full_walk(skip_dirs=skip)
        got = tuple(frame_lines(got))
        assert got == want
        assert all(not fn.startswith("/skipped-lib/") for fn, _, _ in got)

    def user():
        space["wrapper"](leaf)
        leaf()
        space["wrapper"](leaf)

    for _ in range(3):
        space["wrapper"](user)
        user()


def test_stack_texts_are_made_once_per_distinct_stack():
    from msprobe.core.stack import stack_texts
    here = capture_stack()
    first = stack_texts(here)
    assert stack_texts(tuple(here)) is first  # an equal stack captured again (the next step)
    fn, ln, name = frame_lines(here)[0]
    assert first[0] == f"File {fn}, line {ln}, in {name}, \n {linecache.getline(fn, ln).strip()}"
    assert "here = capture_stack()" in first[0]


def test_the_c_walk_equals_the_python_walk():
    import pytest
    from msprobe.core import stack
    if stack._walk is None:
        pytest.skip("msprobe._frames not built (no C compiler, or Python < 3.11)")
    skip = _SKIP_DIRS + ("/skipped-lib/",)
    space = {}
    exec(compile("def wrapper(f):\n    return f()\n", "/skipped-lib/wrap.py", "exec"), space)

    def leaf():
        frame, keeps = sys._getframe().f_back, {}  # (this frame's offset moves on between the walks)
        assert stack._walk(frame, keeps, 30) is None  # codes not seen yet: the Python walk decides
        want = stack.walk_python(frame, keeps, skip, 30)
        assert any(not k for k in keeps.values())  # the wrapper's code is noted as skipped
        for limit in (1, 2, 30):
            assert stack._walk(frame, keeps, limit) == want[:limit]

    space["wrapper"](leaf)

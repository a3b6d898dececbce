"""A step's rank directory and files made in one call that holds no GIL (msprobe._step_files), and the
Python way (core/safe_files.py) for everything else: the same tree, bytes and modes either way; every
case but the usual one goes the Python way, which says why as before, with nothing of the first try left.

No torch here: a DumpWriter on real directories.
"""

import os
import stat

import pytest

from msprobe.core.dump import writer as writer_module
from msprobe.core.dump.reader import DumpReader
from msprobe.core.dump.writer import DumpExistsError, DumpWriter, step_rank_dir
from msprobe.core.safe_files import UnsafePathError

step_files = pytest.importorskip("msprobe._step_files")


class Spy:
    """msprobe._step_files as the writer sees it, counting the calls and how they ended."""

    def __init__(self):
        self.done = self.failed = 0

    def make(self, *args):
        try:
            got = step_files.make(*args)
        except OSError:
            self.failed += 1
            raise
        self.done += 1
        return got


@pytest.fixture
def spy(monkeypatch):
    s = Spy()
    monkeypatch.setattr(writer_module, "_step_files", s)
    return s


def _tree(root):
    """{relative path: (mode, bytes or None for a directory)} of everything under `root` (which files name
    as ROOT)."""
    out = {}
    for d, dirs, names in os.walk(root):
        for n in dirs:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = (stat.S_IMODE(os.lstat(p).st_mode), None)
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = (stat.S_IMODE(os.lstat(p).st_mode),
                                                 f.read().replace(os.fsencode(root), b"ROOT"))
    return out


def _write_step(root, **kw):
    w = DumpWriter(step_rank_dir(str(root), 0, 0), task="tensor", level="mix", framework="pytorch", **kw)
    w.add("Torch.add.0.forward", {"input_args": [], "input_kwargs": {}, "output": [1.5]})
    w.add_construct("Torch.add.0.forward", None)
    w.add_stack("Torch.add.0.forward", ((__file__, 1, "f"),))
    return w


@pytest.mark.parametrize("umask", [0o077, 0o002])
@pytest.mark.parametrize("kw", [{}, {"with_tensors": True}, {"debug": True, "structure": False}])
def test_one_call_makes_what_the_python_way_makes(tmp_path, monkeypatch, spy, kw, umask):
    old = os.umask(umask)
    try:
        fresh, opened = [], []
        for way in ("batched", "python"):
            if way == "python":
                monkeypatch.setattr(writer_module, "_step_files", None)
            root = tmp_path / way
            root.mkdir()
            w = _write_step(root, **kw)
            opened.append(_tree(root))  # as made, before anything is appended or closed
            w.close()
            fresh.append(_tree(root))
    finally:
        os.umask(old)
    assert spy.done == 1 and spy.failed == 0
    assert opened[0] == opened[1] and fresh[0] == fresh[1]
    for mode, content in fresh[0].values():
        assert mode == (0o750 if content is None else 0o640)
    names = {os.path.basename(p) for p in fresh[0]}
    assert ("debug.json" if kw.get("debug") else "dump.json") in names
    assert ("dump_tensor_data" in names) == bool(kw.get("with_tensors"))
    assert ({"construct.json", "stack.json"} <= names) == kw.get("structure", True)


def test_a_step_directory_another_rank_made_is_joined(tmp_path, spy):
    (tmp_path / "step0" / "rank1").mkdir(parents=True)
    _write_step(tmp_path).close()
    assert spy.done == 1
    assert list(DumpReader(str(tmp_path / "step0" / "rank0")).keys()) == ["Torch.add.0.forward"]


def test_another_runs_rank_directory_is_refused_as_before(tmp_path, spy):
    _write_step(tmp_path).close()
    before = _tree(tmp_path)
    with pytest.raises(DumpExistsError, match="already holds a dump from another run"):
        DumpWriter(step_rank_dir(str(tmp_path), 0, 0), task="tensor", level="mix", framework="pytorch",
                   owner=object())
    assert spy.failed == 1 and _tree(tmp_path) == before


@pytest.mark.parametrize("planted", ["link", "file"])
def test_something_else_where_the_step_directory_goes_is_refused_as_before(tmp_path, spy, planted):
    victim = tmp_path / "victim"
    victim.mkdir()
    dump = tmp_path / "dump"
    dump.mkdir()
    if planted == "link":
        os.symlink(victim, dump / "step0")
    else:
        (dump / "step0").write_text("not a directory")
    with pytest.raises(UnsafePathError, match="symbolic link" if planted == "link" else "not a directory"):
        _write_step(dump)
    assert spy.failed == 1 and os.listdir(victim) == [] and os.listdir(dump) == ["step0"]


def test_a_missing_dump_path_is_made_the_python_way(tmp_path, spy):
    root = tmp_path / "not" / "yet"
    _write_step(root).close()
    assert spy.failed == 1
    assert stat.S_IMODE(os.stat(tmp_path / "not").st_mode) == 0o750
    assert list(DumpReader(str(root / "step0" / "rank0")).keys()) == ["Torch.add.0.forward"]


def test_a_failure_part_way_leaves_nothing_it_made(tmp_path):
    step, rank = tmp_path / "step0", tmp_path / "step0" / "rank0"
    files = [(str(rank / "dump.json"), b"{}"), (str(rank / "no" / "such.json"), b"{}")]
    with pytest.raises(FileNotFoundError) as got:
        step_files.make(str(step), str(rank), [str(rank / "dump_tensor_data")], files, 0o750, 0o640)
    assert got.value.filename == str(rank / "no" / "such.json")
    assert os.listdir(tmp_path) == []
    step.mkdir()  # a step directory that was there stays
    with pytest.raises(FileNotFoundError):
        step_files.make(str(step), str(rank), [], files, 0o750, 0o640)
    assert os.listdir(tmp_path) == ["step0"] and os.listdir(step) == []


def test_the_call_hands_back_open_files_holding_their_first_bytes(tmp_path):
    step, rank = tmp_path / "step0", tmp_path / "step0" / "rank0"
    made, fds = step_files.make(str(step), str(rank), [], [(str(rank / "a.json"), b'{"x": 1}')], 0o750, 0o640)
    os.pwrite(fds[0], b"\n", 8)  # (written with pwrite: the offset is still 0)
    os.close(fds[0])
    assert made is True and (rank / "a.json").read_bytes() == b'{"x": 1}\n'
    made, fds = step_files.make(str(step), str(tmp_path / "step0" / "rank1"), [], [], 0o750, 0o640)
    assert made is False and fds == []
    with pytest.raises(TypeError):
        step_files.make(str(step), str(rank), [], [("a.json", "not bytes")], 0o750, 0o640)

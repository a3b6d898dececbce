"""PendingWriter: a step's files opened on the writer pool; a step that records nothing leaves nothing."""

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from msprobe.core.dump.writer import DumpWriter, PendingWriter, step_rank_dir


@pytest.fixture
def pool():
    with ThreadPoolExecutor(max_workers=1) as executor:
        yield executor


def opener(dump_path, step=0, rank=0, **kwargs):
    return lambda: DumpWriter(step_rank_dir(str(dump_path), step, rank), task="statistics", level="L0",
                              framework="pytorch", **kwargs)


def test_take_gives_the_open_writer(tmp_path, pool):
    writer = PendingWriter(pool, opener(tmp_path)).take()
    writer.add("Module.fc.Linear.forward.0", {"input_args": [], "input_kwargs": {}, "output": []})
    writer.close()
    with open(tmp_path / "step0" / "rank0" / "dump.json", encoding="utf-8") as f:
        assert list(json.load(f)["data"]) == ["Module.fc.Linear.forward.0"]


def test_discard_removes_what_it_made_down_to_a_missing_dump_path(tmp_path, pool):
    dump_path = tmp_path / "not" / "there"
    PendingWriter(pool, opener(dump_path, with_tensors=True)).discard()
    assert os.listdir(tmp_path) == []


def test_discard_keeps_what_others_made(tmp_path, pool):
    """Another rank's directory in the same step, and the dump path the user made, stay."""
    other = PendingWriter(pool, opener(tmp_path, rank=1)).take()
    PendingWriter(pool, opener(tmp_path, rank=0)).discard()
    assert os.listdir(tmp_path) == ["step0"]
    assert os.listdir(tmp_path / "step0") == ["rank1"]
    other.close()


def test_an_error_opening_is_raised_by_take_and_ignored_by_discard(tmp_path, pool):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError):
        PendingWriter(pool, opener(blocker)).take()
    PendingWriter(pool, opener(blocker)).discard()  # nothing was made: nothing to do, no error
    assert os.listdir(tmp_path) == ["file"]

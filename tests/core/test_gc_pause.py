"""CollectorPause, and the dump debuggers pausing cyclic GC from start() to stop() only."""

import gc
import weakref

import pytest
import torch

from msprobe.core.dump.reader import DumpReader, find_rank_dirs
from msprobe.core.gc_pause import CollectorPause
from msprobe.pytorch import PrecisionDebugger


@pytest.fixture(autouse=True)
def collector_enabled():
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


class _Cycle:
    def __init__(self):
        self.me = self


def test_pause_resume_idempotent():
    p = CollectorPause()
    p.pause()
    p.pause()
    assert not gc.isenabled() and p.paused
    p.resume()
    assert gc.isenabled() and not p.paused
    p.resume()
    assert gc.isenabled()


def test_leaves_a_disabled_collector_disabled():
    gc.disable()
    with CollectorPause() as p:
        assert not p.paused  # it did not disable it, so it must not enable it
    assert not gc.isenabled()


def test_two_pausers_first_one_restores():
    a, b = CollectorPause(), CollectorPause()
    a.pause()
    b.pause()  # already off: b owns nothing
    b.resume()
    assert not gc.isenabled()
    a.resume()
    assert gc.isenabled()


def _train_step(model, x):
    model(x).sum().backward()


def test_debugger_pauses_between_start_and_stop(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    x = torch.randn(3, 4)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="mix")
    try:
        dbg.start(model)
        assert not gc.isenabled()
        _train_step(model, x)
        dbg.stop()
        assert gc.isenabled()
        dbg.step()
        assert gc.isenabled()
        # step() alone (no stop()) also ends the pause
        dbg.start(model)
        assert not gc.isenabled()
        _train_step(model, x)
        dbg.step()
        assert gc.isenabled()
    finally:
        dbg.close()
    assert gc.isenabled()
    data = [DumpReader(r.path) for r in find_rank_dirs(str(tmp_path))]
    assert len(data) == 2 and all(len(d) > 0 for d in data)


def test_cycles_made_during_a_step_are_collected_after_it(tmp_path):
    model = torch.nn.Linear(4, 4)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    try:
        dbg.start(model)
        _train_step(model, torch.randn(2, 4))
        ref = weakref.ref(_Cycle())  # garbage only the cyclic collector can free
        assert ref() is not None
        dbg.stop()
        dbg.step()
        gc.collect()
        assert ref() is None
    finally:
        dbg.close()


def test_step_that_raised_then_close_restores(tmp_path):
    model = torch.nn.Linear(4, 4)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    dbg.start(model)
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 5))  # shape error inside the captured step
    assert not gc.isenabled()
    dbg.close()  # what atexit does too
    assert gc.isenabled()


def test_user_disabled_collector_stays_disabled(tmp_path):
    gc.disable()
    model = torch.nn.Linear(4, 4)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    try:
        dbg.start(model)
        _train_step(model, torch.randn(2, 4))
        dbg.stop()
        dbg.step()
        assert not gc.isenabled()
    finally:
        dbg.close()


def test_what_stays_alive_after_stop_does_not_grow_with_the_records(tmp_path):
    """The collector resumes at stop(): the step's summary caches are let go there, so its first young
    collection does not walk (and promote) an object per record made."""
    def alive_after_stop(calls, run):
        dbg = PrecisionDebugger(dump_path=str(tmp_path / run), level="L1")
        x = torch.randn(4, 8)
        try:
            dbg.start()
            for _ in range(calls):
                x = torch.tanh(x)  # each call's tensors die: only what msprobe keeps stays
            dbg.stop()
            gc.disable()  # counted as stop() left them
            alive = len(gc.get_objects())
            gc.enable()
            dbg.step()
        finally:
            dbg.close()
        return alive

    alive_after_stop(20, "warm")  # first-call caches (API table, stacks)
    few, many = alive_after_stop(20, "few"), alive_after_stop(420, "many")
    assert many - few < 200, (few, many)

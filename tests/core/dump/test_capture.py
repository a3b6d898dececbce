"""CaptureSession (core/dump/capture.py) on its own: records handed to it with `emit`/`note_structure` reach
dump.json and construct.json in capture order, in batches, with their deferred summaries filled in; the
background flusher writes a queue left idle; a mutation launches the waiting summaries first; a failed
write stops the dump and not the caller. The framework is numpy, with no call interception at all."""

import contextlib
import json
import os
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from msprobe.core.config import config_from_dict
from msprobe.core.dump import capture
from msprobe.core.dump.capture import CaptureSession


class Summaries:
    """Summaries that wait for a resolve (or a mutation) before they read their arrays."""

    def __init__(self):
        self.waiting = []  # (array, record)
        self.resolves = 0

    @property
    def pending(self):
        return len(self.waiting)

    def defer(self, a, rec):
        self.waiting.append((a, rec))

    def launch(self, touching=None):
        for a, rec in self.waiting:
            rec.update({"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()), "Norm": 0.0})
        self.waiting = []

    def start_resolve(self):
        self.resolves += 1
        return self

    def finish(self):
        self.launch()

    def clear(self):
        self.waiting = []


class Session(CaptureSession):
    framework = "numpy"
    calls = types.SimpleNamespace(ops=types.SimpleNamespace(work=contextlib.nullcontext))

    def _new_summarizer(self):
        return Summaries()

    def record(self, key, array, parent=None):
        """What an adapter hands over for one call: its record (summary deferred) and structure."""
        out = {"type": "numpy.ndarray", "dtype": str(array.dtype), "shape": list(array.shape)}
        self.summarizer.defer(array, out)
        self.emit(key, {"input_args": [], "input_kwargs": {}, "output": [out]})
        self.note_structure(key, parent, None)


def session(tmp_path, task="statistics", level="mix"):
    cfg = config_from_dict({"task": task, "level": level, "dump_path": str(tmp_path), task: {}})
    return Session(cfg, 0, 0)


def on_disk(tmp_path, name="dump.json"):
    path = tmp_path / "step0" / "rank0" / name
    if not path.exists():
        return {}
    doc = json.loads(path.read_text())
    return doc["data"] if name == "dump.json" else doc


def test_records_are_written_at_a_resolve_in_capture_order_with_their_summaries(tmp_path):
    s = session(tmp_path)
    s.record("Module.fc.Linear.forward.0", np.array([1.0, 3.0]))
    s.record("Functional.relu.0.forward", np.array([-2.0, 2.0]), parent="Module.fc.Linear.forward.0")
    assert on_disk(tmp_path) == {}  # queued, not written
    s.resolve()
    data = on_disk(tmp_path)
    assert list(data) == ["Module.fc.Linear.forward.0", "Functional.relu.0.forward"]
    assert data["Functional.relu.0.forward"]["output"][0]["Max"] == 2.0
    assert data["Module.fc.Linear.forward.0"]["output"][0]["Mean"] == 2.0
    assert on_disk(tmp_path, "construct.json") == {"Module.fc.Linear.forward.0": None,
                                                     "Functional.relu.0.forward": "Module.fc.Linear.forward.0"}
    s.close()


def test_a_full_queue_is_written_while_records_come(tmp_path):
    from msprobe.core.dump import flusher
    s = session(tmp_path)
    flusher.unwatch(s)  # the queue's length writes it here (a loaded machine's pause would let the flusher in)
    for i in range(capture.FLUSH_RECORDS + 1):
        s.record(f"Functional.add.{i}.forward", np.array([float(i)]))
        assert len(s._queue) <= capture.FLUSH_RECORDS
    written = on_disk(tmp_path)
    assert written and len(written) + len(s._queue) == capture.FLUSH_RECORDS + 1
    assert list(written) == [f"Functional.add.{i}.forward" for i in range(len(written))]
    s.close()
    assert len(on_disk(tmp_path)) == capture.FLUSH_RECORDS + 1


def test_the_flusher_writes_an_idle_queue_only_when_its_summaries_are_ready(tmp_path):
    s = session(tmp_path)
    s.emit("Functional.add.0.forward", {"input_args": [], "input_kwargs": {}, "output": [None]})
    deadline = time.monotonic() + capture.IDLE_SECONDS + 10
    while not on_disk(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(on_disk(tmp_path)) == ["Functional.add.0.forward"]  # nobody called resolve()
    s.record("Functional.add.1.forward", np.array([1.0]))  # a device summary would race the step
    time.sleep(capture.IDLE_SECONDS + 1.0)
    assert list(on_disk(tmp_path)) == ["Functional.add.0.forward"]
    s.close()
    assert list(on_disk(tmp_path)) == ["Functional.add.0.forward", "Functional.add.1.forward"]


def test_a_mutation_launches_the_waiting_summaries_first(tmp_path):
    s = session(tmp_path)
    a = np.array([1.0, 2.0])
    s.record("Functional.add.0.forward", a)
    s.before_mutation([a])
    a += 100.0  # the in-place call the adapter is about to run
    s.close()
    assert on_disk(tmp_path)["Functional.add.0.forward"]["output"][0]["Max"] == 2.0


def test_the_structure_task_writes_no_records(tmp_path):
    s = session(tmp_path, task="structure")
    s.record("Module.fc.Linear.forward.0", np.array([1.0]))
    s.close()
    assert on_disk(tmp_path) == {}
    assert on_disk(tmp_path, "construct.json") == {"Module.fc.Linear.forward.0": None}


def test_a_failed_write_stops_the_dump_not_the_caller(tmp_path):
    (tmp_path / "step0").write_text("a file where the step directory goes")
    s = session(tmp_path)
    failures = []
    s.on_failure = lambda session, error: failures.append(error)
    s.record("Functional.add.0.forward", np.array([1.0]))
    s.record("Functional.add.1.forward", np.array([2.0]))  # dropped, said no second time
    s.close()
    assert len(failures) == 1 and s.failed is failures[0] and "is not a directory" in str(failures[0])
    assert os.path.isfile(tmp_path / "step0")


class _LetsOneIn:
    """A session's queue lock that lets one record in just before the flusher takes it: the training
    thread running between the flusher's look at the summaries and its taking the lock."""

    def __init__(self, lock, record):
        self._lock, self._record = lock, record

    def acquire(self, blocking=True, timeout=-1):
        if timeout != -1 and self._record is not None:  # the flusher's acquire(timeout=...)
            record, self._record = self._record, None
            record()
        return self._lock.acquire(blocking, timeout)

    def release(self):
        self._lock.release()

    def locked(self):
        return self._lock.locked()

    def __enter__(self):
        self._lock.acquire()

    def __exit__(self, *exc):
        self._lock.release()


def test_the_flusher_leaves_a_record_that_came_while_it_looked(tmp_path):
    """Written by the flusher before its summary is read, a record's fields would stay null."""
    from msprobe.core.dump import flusher
    s = session(tmp_path)
    flusher.unwatch(s)  # this test is the flusher
    s.emit("Functional.add.0.forward", {"input_args": [], "input_kwargs": {}, "output": [None]})
    s._lock = _LetsOneIn(s._lock, lambda: s.record("Functional.add.1.forward", np.array([1.0, 3.0])))
    s._idle_puts, s._idle_since = s._puts, time.monotonic() - 2 * capture.IDLE_SECONDS  # idle, as it looks
    s.write_idle()
    assert "Functional.add.1.forward" not in on_disk(tmp_path)
    s.close()
    assert on_disk(tmp_path)["Functional.add.1.forward"]["output"][0]["Max"] == 3.0


def test_a_record_never_waits_for_the_step_files_opening_on_the_pool(tmp_path):
    """The step's directory and files open on the writer pool as the session starts (PendingWriter); the
    session takes them at its first write, so a record that comes first does not wait for the pool."""
    from msprobe.core.dump import flusher

    opening = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(opening.wait, 10)  # the pool is busy: the step's files wait their turn
        cfg = config_from_dict({"task": "statistics", "level": "mix", "dump_path": str(tmp_path), "statistics": {}})
        s = Session(cfg, 0, 0, pool=pool)
        flusher.unwatch(s)
        for i in range(capture.CHECK_EVERY + 2):  # past a look at the queue
            s.record(f"Functional.add.{i}.forward", np.array([float(i), 1.0]))
        assert s.writer is None and not (tmp_path / "step0").exists()
        opening.set()
        s.close()
    data = on_disk(tmp_path)
    assert len(data) == capture.CHECK_EVERY + 2 and data["Functional.add.3.forward"]["output"][0]["Max"] == 3.0

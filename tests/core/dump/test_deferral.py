"""Deferral (core/dump/deferral.py): the one deferral design of both adapters, on its own with numpy
arrays as the tensors: batches, what an in-place change sends first, resolves, and no cycle with its owner."""

import gc
import threading
import weakref

import numpy as np

from msprobe.core.dump.deferral import Deferral


class Reader:
    """An owner whose bound method reads the batches (as DeviceSummaries and MindSpore's session do)."""

    def __init__(self, max_items=3, max_bytes=None, select=None):
        self.batches = []
        self.deferral = Deferral(self.read, max_items, max_bytes, select)

    def read(self, items):
        self.batches.append([float(a.max()) for a in items])


def shares_memory(items, touching):
    go = [a for a in items if any(np.shares_memory(a, t) for t in touching)]
    return go, [a for a in items if not any(np.shares_memory(a, t) for t in touching)]


def test_add_says_when_the_batch_is_full_by_count_or_bytes():
    r = Reader(max_items=3)
    assert [r.deferral.add(np.full(2, float(i))) for i in range(3)] == [False, False, True]
    r = Reader(max_items=100, max_bytes=32)
    assert r.deferral.add(np.zeros(2), 16) is False
    assert r.deferral.add(np.zeros(2), 16) is True


def test_launch_reads_everything_in_order_and_empties():
    r = Reader(max_items=10)
    for i in range(4):
        r.deferral.add(np.full(3, float(i)))
    r.deferral.launch()
    assert r.batches == [[0.0, 1.0, 2.0, 3.0]]
    assert len(r.deferral) == 0 and not r.deferral
    r.deferral.launch()  # nothing waits: nothing read
    assert len(r.batches) == 1


def test_an_inplace_change_sends_only_what_it_touches_first():
    r = Reader(max_items=10, select=shares_memory)
    a, b, c = np.full(4, 1.0), np.full(4, 2.0), np.full(4, 3.0)
    for x in (a, b, c):
        r.deferral.add(x, x.nbytes)
    r.deferral.launch([b[1:]])  # a view of b is about to change
    assert r.batches == [[2.0]]
    assert [float(x.max()) for x in r.deferral.items()] == [1.0, 3.0]  # the others keep waiting, in order
    r.deferral.launch([np.zeros(1)])  # touches none of them: nothing goes
    assert r.batches == [[2.0]]
    r.deferral.launch(None)  # not known what changes: everything goes
    assert r.batches == [[2.0], [1.0, 3.0]]


def test_a_take_on_another_thread_during_an_inplace_launch_reads_each_item_once():
    """The flusher's thread may take the whole queue while the training thread picks what an in-place
    change touches: what that take read is not read again, and what comes later is not lost."""
    r = None

    def select_while_the_flusher_takes(items, touching):
        flusher = threading.Thread(target=lambda: r.deferral.take().finish())
        flusher.start()
        flusher.join()
        r.deferral.add(np.full(2, 9.0))  # queued meanwhile
        return shares_memory(items, touching)

    r = Reader(max_items=10, select=select_while_the_flusher_takes)
    a, b = np.full(2, 1.0), np.full(2, 2.0)
    for x in (a, b):
        r.deferral.add(x, x.nbytes)
    r.deferral.launch([a])
    assert r.batches == [[1.0, 2.0]]  # the flusher's take read both; the in-place launch has none left
    assert [float(x.max()) for x in r.deferral.items()] == [9.0]


def test_an_inplace_launch_that_selects_everything_reads_the_whole_queue_once():
    """A select that keeps nothing back (DeviceSummaries' above SHARE_CHECK_MAX waiting) sends the queue as
    one batch, what was queued since it looked included, and each item once even when the flusher's thread
    took some meanwhile."""
    r = None
    seen = []

    def everything_while_the_flusher_takes_one(items, touching):
        seen.append(len(items))
        if len(seen) == 2:
            flusher = threading.Thread(target=lambda: r.deferral.take().finish())
            flusher.start()
            flusher.join()
        r.deferral.add(np.full(2, 9.0))  # queued after the select looked
        return list(items), []

    r = Reader(max_items=10, select=everything_while_the_flusher_takes_one)
    for v in (1.0, 2.0):
        r.deferral.add(np.full(2, v), 16)
    r.deferral.launch([np.zeros(1)])
    assert r.batches == [[1.0, 2.0, 9.0]]
    assert len(r.deferral) == 0 and r.deferral.held == 0
    r.deferral.add(np.full(2, 3.0), 16)
    r.deferral.launch([np.zeros(1)])  # the flusher takes the 3.0 while the select looks
    assert r.batches == [[1.0, 2.0, 9.0], [3.0], [9.0]]
    assert len(r.deferral) == 0


def test_take_hands_a_batch_read_later_and_keeps_what_comes_after():
    r = Reader(max_items=10)
    r.deferral.add(np.full(2, 5.0))
    batch = r.deferral.take()
    r.deferral.add(np.full(2, 6.0))  # queued after the take: waits for the next one
    assert r.batches == []
    batch.finish()
    assert r.batches == [[5.0]]
    assert len(r.deferral) == 1
    batch.finish()  # read once only
    assert r.batches == [[5.0]]


def test_the_deferral_does_not_keep_its_owner_alive():
    gc.disable()
    try:
        r = Reader()
        r.deferral.add(np.ones(2))
        batch = r.deferral.take()
        ref = weakref.ref(r)
        del r
        assert ref() is None  # freed by reference counting: no cycle through the bound method
        batch.finish()  # its reader is gone: nothing to do, no error
    finally:
        gc.enable()

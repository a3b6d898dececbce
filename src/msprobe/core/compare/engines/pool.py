"""The process-pool engine: forked worker processes on this host, or this process alone.
Must not import torch or mindspore.
"""
from __future__ import annotations

import multiprocessing

_shared = None  # a worker's copy of the run's shared part, set once when the worker starts


def _set_shared(shared):
    global _shared
    _shared = shared


def _call(fn, item):
    return fn(_shared, item)


class PoolEngine:
    name = "pool"
    lean_driver = False

    def __init__(self, workers=1):
        self.slots = max(1, int(workers))
        self.inline = self.slots == 1

    def run(self, fn, shared, items):
        items = list(items)
        if self.inline:
            for i, item in enumerate(items):
                yield i, fn(shared, item)
            return
        from concurrent.futures import ProcessPoolExecutor
        # fork: spawned workers would re-run the caller's __main__ (a training script, a notebook)
        with ProcessPoolExecutor(max_workers=min(self.slots, len(items)) or 1,
                                 mp_context=multiprocessing.get_context("fork"),
                                 initializer=_set_shared, initargs=(shared,)) as pool:
            for i, out in enumerate(pool.map(_call, [fn] * len(items), items, chunksize=1)):
                yield i, out

    def close(self):
        pass

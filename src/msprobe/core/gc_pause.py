"""CPython's cyclic garbage collector paused over work that allocates many short-lived containers
holding no cycles; reference counting still frees them (and everything else) at once.

Used by the dump debuggers from start() to stop()/step(), and again while step() closes the session. A step being dumped allocates ~10
GC-tracked objects per record (records, cache entries, weak references, backward trackers, the
Python wrappers of the autograd nodes the graph walk reads) that live until the step ends: every
young collection walks them again, and those that survive two are promoted to the oldest
generation, whose collection walks every object of the process (tens of ms with torch imported; see
benchmarks/RESULTS.md, PyTorch design notes). The cycles the training code makes meanwhile wait at
most one step for the first collection after it. Used also by the compare engine while it parses a dump.

Must not import torch or mindspore.
"""

import gc


class CollectorPause:
    """`pause()` disables the collector when it is enabled; `resume()` enables it again only if this
    object disabled it (a program that turned collection off itself keeps it off). Both are
    idempotent; also a context manager."""

    __slots__ = ("_paused",)

    def __init__(self):
        self._paused = False

    @property
    def paused(self):
        return self._paused

    def pause(self):
        if not self._paused and gc.isenabled():
            gc.disable()
            self._paused = True

    def resume(self):
        if self._paused:
            self._paused = False
            gc.enable()

    def __enter__(self):
        self.pause()
        return self

    def __exit__(self, *exc):
        self.resume()
        return False

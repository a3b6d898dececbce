"""Deferral: tensor summaries that wait to be read together — the one deferral design of both adapters.

Reading one tensor's summary at a time costs a kernel launch per tensor (PyTorch on an accelerator) or a
wait for the whole op pipeline (MindSpore PyNative). So a record's tensors wait here and go in batches:

    add(item, nbytes)   queue one; True when the batch is full (the adapter sends it: `launch` or a resolve)
    launch(touching)    something is about to change tensors in place: what waits for them goes now
    take()              everything waiting, as a batch whose `finish()` reads it (a resolve)

What reading a batch means is the adapter's `run(items)`: PyTorch launches the summary kernels into
device slots (pytorch/summary/device.py), MindSpore reads the tensors and fills their records
(mindspore/session.py). `run` is held through a weak reference when it is a bound method: the object
that owns the Deferral must not be kept alive by it (a cycle freed only by the cyclic collector).
`select(items, touching)` splits the items into (those `touching` may change, the others); without it,
or with `touching` None, everything goes. Framework-free.
"""

import threading
import types
import weakref


class Deferral:
    """The items waiting for one batched read.

    Args:
        run: callable taking a list of items: reads them (see the module doc).
        max_items: `add` says the batch is full at this many items.
        max_bytes: ... or at this many bytes of tensor data (None: no bound).
        select: callable (items, touching) -> (items to read now, items that keep waiting), or None.
    """

    __slots__ = ("queue", "held", "max_items", "max_bytes", "_run", "_select", "_taking")

    def __init__(self, run, max_items, max_bytes=None, select=None):
        # (item, bytes) pairs: one list, so that a take() on another thread never splits a pair; read
        # by an adapter's hot path as `len(queue)` (a __len__ call costs a Python frame)
        self.queue = []
        # bytes of tensor data the queue holds; an adapter's hot path may `add` inline (append the pair to
        # `queue`, add its bytes here, compare both with the bounds): a frame a tensor
        self.held = 0
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._run = weakref.WeakMethod(run) if isinstance(run, types.MethodType) else (lambda: run)
        self._select = select
        # held by whatever removes items (a take on the flusher's thread, a narrowing on the training
        # thread): `add` only appends, which needs no lock
        self._taking = threading.Lock()

    def __len__(self):
        return len(self.queue)

    def __bool__(self):
        return bool(self.queue)

    def items(self):
        """The items waiting now (a copy: another thread may add meanwhile)."""
        return [item for item, _ in self.queue[:]]

    def add(self, item, nbytes=0):
        """Queue `item` (`nbytes` of tensor data held); True when the batch is full."""
        self.queue.append((item, nbytes))
        self.held += nbytes
        return len(self.queue) >= self.max_items or (self.max_bytes is not None and self.held >= self.max_bytes)

    def launch(self, touching=None):
        """Read what waits now: the items `touching` may change (all of them without `select`, or when
        `touching` is None or empty); the others keep waiting for a larger batch."""
        if not self.queue:
            return
        if touching and self._select is not None:
            go, rest = self._select(self.items(), touching)
            if not go:
                return
            if not rest:  # all of them (a large batch): no sorting of the queue by item
                self._call(self.take().items)
                return
            chosen = {id(item) for item in go}
            with self._taking:
                pairs = self.queue[:]
                # only the pairs looked at: what was queued meanwhile stays, and a take on another
                # thread since then has left nothing chosen to read twice
                go = [item for item, _ in pairs if id(item) in chosen]
                # (in place: an adapter may hold the list, see `queue`)
                self.queue[:len(pairs)] = [pair for pair in pairs if id(pair[0]) not in chosen]
                self.held = sum(n for _, n in self.queue)
            self._call(go)
            return
        self._call(self.take().items)

    def take(self):
        """Everything waiting, removed, as a Batch (`finish()` reads it)."""
        with self._taking:
            pairs = self.queue[:]
            del self.queue[:len(pairs)]  # (not clear(): keeps what another thread queued meanwhile)
            self.held = sum(n for _, n in self.queue)
        return Batch([item for item, _ in pairs], self._run)

    def _call(self, items):
        run = self._run()
        if run is not None and items:
            run(items)


class Batch:
    """Items taken from a Deferral, read by `finish()`."""

    __slots__ = ("items", "_run")

    def __init__(self, items, run):
        self.items, self._run = items, run

    def finish(self):
        items, self.items = self.items, []
        run = self._run()
        if run is not None and items:
            run(items)

"""Where device summaries land: a slot is one row of a buffer on the tensor's device — (max, min, sum, sum
of squares) in float64 for statistics, the raw CRC-32 (core/checksum.py) in an int64 for a checksum."""

import torch

# slots per device buffer; a batch that fills one goes on in a second
SLOTS_PER_BUFFER = 4096
STATS, CHECKSUM = 0, 1
WIDTH = {STATS: 4, CHECKSUM: 1}
ROW_BYTES = {STATS: 32, CHECKSUM: 8}
_DTYPES = {STATS: torch.float64, CHECKSUM: torch.int64}


class Slot:
    """Where one tensor's summary lands: `values` once resolved; the records waiting to be filled."""

    __slots__ = ("kind", "buffer", "index", "n", "dtype", "nbytes", "values", "waiting")

    def __init__(self, kind, buffer, index, n, dtype, nbytes):
        self.kind, self.buffer, self.index, self.n, self.dtype, self.nbytes = kind, buffer, index, n, dtype, nbytes
        self.values = None
        self.waiting = []

    @property
    def row(self):
        return self.buffer.rows[self.index]

    @property
    def address(self):
        """The device address of the slot's row (what the Triton kernels write to)."""
        return self.buffer.rows.data_ptr() + self.index * ROW_BYTES[self.kind]


class Buffer:
    """SLOTS_PER_BUFFER rows of one kind on one device; `slots`: those made in it, in row order."""

    __slots__ = ("device", "kind", "rows", "used", "slots")

    def __init__(self, device, kind):
        self.device, self.kind = device, kind
        self.rows = torch.empty((SLOTS_PER_BUFFER, WIDTH[kind]), dtype=_DTYPES[kind], device=device)
        self.used = 0
        self.slots = []


def fill_from_slot(rec, slot):
    """`rec` gets the slot's values now or when it is resolved (perhaps on the lane thread: this appends
    to `waiting` before looking again, the resolve sets `values` before it fills the waiting records)."""
    values = slot.values
    if values is None:
        slot.waiting.append(rec)
        values = slot.values
    if values is not None:
        rec.update(values)

"""Where device summaries land: a slot is one row of a buffer on the tensor's device — (max, min, sum, sum
of squares) in float64 for statistics, the raw CRC-32 (core/checksum.py) in an int64 for a checksum.

A slot is the tuple (buffer, row index): no object of its own per tensor (a summary's host cost is a few
list appends). What a row's values mean (its tensor's element count, dtype, bytes) is kept by the buffer
in lists indexed by row, and the records waiting for a row as (row, record) pairs."""

import torch

# slots per device buffer; a batch that fills one goes on in a second
SLOTS_PER_BUFFER = 4096
STATS, CHECKSUM = 0, 1
WIDTH = {STATS: 4, CHECKSUM: 1}
ROW_BYTES = {STATS: 32, CHECKSUM: 8}
_DTYPES = {STATS: torch.float64, CHECKSUM: torch.int64}


class Buffer:
    """SLOTS_PER_BUFFER rows of one kind on one device; per row made so far (`used` of them): its tensor's
    element count and dtype (statistics) or bytes (checksums), and `fields`: the dict its values go into
    when resolved (a tensor's record fields, shared by its records); `values`: `fields` once resolved
    (None before); `fills`: (row, record) of other records waiting for it; `lost`: rows whose tensor's
    memory was freed before it could be read (their fields resolve to null)."""

    __slots__ = ("device", "kind", "rows", "used", "ns", "dtypes", "nbytes", "fields", "values", "fills", "lost")

    def __init__(self, device, kind):
        self.device, self.kind = device, kind
        self.rows = torch.empty((SLOTS_PER_BUFFER, WIDTH[kind]), dtype=_DTYPES[kind], device=device)
        self.used = 0
        self.ns, self.dtypes, self.nbytes = [], [], []
        self.fields = []
        self.values = None
        self.fills = []
        self.lost = []

    def slot(self, n, dtype, nbytes=0, fields=None):
        """A new slot (self, row) for a tensor of `n` elements of `dtype` (`nbytes`: its bytes, checksums);
        its values go into dict `fields` when resolved (None: a new dict)."""
        i = self.used
        self.used = i + 1
        if self.kind == STATS:  # (what readback reads of a row of each kind)
            self.ns.append(n)
            self.dtypes.append(dtype)
        else:
            self.nbytes.append(nbytes)
        self.fields.append({} if fields is None else fields)
        return (self, i)


def lose(slot):
    """The slot's tensor can no longer be read: its fields resolve to null."""
    buf, i = slot
    buf.lost.append(i)


def row(slot):
    """The slot's row (a view of its buffer)."""
    buf, i = slot
    return buf.rows[i]


def address(slot):
    """The device address of the slot's row (what the Triton kernels write to)."""
    buf, i = slot
    return buf.rows.data_ptr() + i * ROW_BYTES[buf.kind]


def fill_from_slot(rec, slot):
    """`rec` gets the slot's values now or when it is resolved (perhaps on the lane thread: this appends
    to `fills` before looking again, the resolve sets `values` before it fills the waiting records)."""
    buf, i = slot
    values = buf.values
    if values is None:
        buf.fills.append((i, rec))
        values = buf.values
    if values is not None:
        rec.update(values[i])

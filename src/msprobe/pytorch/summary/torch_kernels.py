"""The summary kernels in torch's own ops, on the tensor's device: what NPUs, CUDA without Triton and the
CPU path the tests force (`MSPROBE_DEVICE_SUMMARY=1`) run. A few launches a tensor; a batch of small
tensors of one dtype in a few launches in all: those of one shape stacked into rows (one copy, no Python
object per tensor), the rest concatenated and reduced by segment.

Protocol (the same in triton_kernels.py): `statistics(batch)`, items (x, n, slot, rows): Max/Min/Sum/Sum
of squares of `x` (n elements; `rows` unused here) into the slot's row; `checksum(batch)`, items (x,
slot): the raw CRC-32 of `x`'s bytes in index order (core/checksum.py: rows of ROW bytes from the end, one table
lookup a byte, each row shifted by the rows after it, xored) into the slot's row. Rows here are 1 KB
(Triton's are 64 bytes): a tensor of up to 1 KB is one row, a gather and ten xors, no shift; launches,
not bytes, are what a small tensor costs.
"""

import numpy as np
import torch

from msprobe.core import checksum as crc
from msprobe.pytorch.summary.slots import row as slot_row
from msprobe.pytorch.summary.transfer import index_tensor, to_device_async

# deferred tensors of at most this many elements (by device type) are reduced together: one concatenation
# and segment reductions instead of five launches a tensor; on CPU the concatenation costs more than the
# launches it saves above a few thousand elements
GROUP_ELEMENTS = {"cpu": 2048}
GROUP_ELEMENTS_ELSEWHERE = 1 << 16
GROUP_TOTAL = 1 << 22  # elements per grouped reduction: float64 temporaries of 32 MB
# tensors of one shape up to this many elements are stacked (a copy each, no launch each): on CPU too
STACK_ELEMENTS = 1 << 16
# bytes a CRC row (the row table is ROW x 256 int32: 1 MB)
ROW = 1024
# rows shifted by one table lookup (the table is NEAR x 1024 int32: 256 KB): tensors up to NEAR rows
# need no shift levels
NEAR = 64
_NEAR_BITS = NEAR.bit_length() - 1
# CRC rows a pass reads: bounds the temporaries (about 12 bytes a byte read) at 48 MB
CRC_ROWS = (4 << 20) // ROW
_crc_tables = {}  # device -> (row table, near-row table, shift tables, column offsets, bit numbers, byte offsets)
_pads = {}  # (device, bytes) -> zeros that pad a tensor in front to whole rows


def handles(dtype):
    return True


def statistics(batch):
    """Statistics of items (x, n, slot, rows) of one device and dtype: small tensors of one shape stacked
    into rows (one copy) and reduced along them, a few launches for all; the other small ones concatenated
    (as float64, exact for every real dtype) and reduced by segment; the large ones a tensor at a time."""
    shapes, alone = _by_shape(batch, STACK_ELEMENTS)
    mixed, out = [], _Rows()
    for items in shapes.values():
        if len(items) == 1:
            mixed.append(items[0])
            continue
        per = max(1, GROUP_TOTAL // max(1, items[0][1]))
        for i in range(0, len(items), per):
            chunk = items[i:i + per]
            xs, _, slots, _ = zip(*chunk)  # (columns of the items, without a Python step each)
            try:
                with torch.no_grad():
                    m = _rows_of(xs).to(torch.float64)
                    values = torch.stack((m.amax(1), m.amin(1), m.sum(1), (m * m).sum(1)), dim=1)
            except (RuntimeError, NotImplementedError):
                mixed.extend(chunk)
                continue
            out.add(slots, values)
    if mixed:
        chunks, rest = _grouped(mixed, lambda item: True)
        alone.extend(rest)
        for chunk in chunks:
            try:
                with torch.no_grad():
                    lengths = index_tensor([n for _, n, _, _ in chunk], chunk[0][0].device)
                    flat = torch.cat([x.reshape(-1) for x, _, _, _ in chunk]).to(torch.float64)
                    # unsafe: the lengths are right by construction, and checking them reads them back
                    values = torch.stack([torch.segment_reduce(flat, op, lengths=lengths, unsafe=True)
                                          for op in ("max", "min", "sum")]
                                         + [torch.segment_reduce(flat * flat, "sum", lengths=lengths, unsafe=True)],
                                         dim=1)
            except (RuntimeError, NotImplementedError):
                alone.extend(chunk)
                continue
            out.add([slot for _, _, slot, _ in chunk], values)
    out.store()
    for x, _, slot, _ in alone:
        _stats_one(x, slot)


def row_statistics(stages):
    """Statistics of each row of staging buffers (device.py), [(rows (k, n), the k rows' slots)] of one
    device: a few launches a buffer, no copy of the rows, the results stored together."""
    out = _Rows()
    with torch.no_grad():
        for rows, slots in stages:
            m = rows.to(torch.float64)
            out.add(slots, torch.stack((m.amax(1), m.amin(1), m.sum(1), (m * m).sum(1)), dim=1))
    out.store()


def _rows_of(xs):
    """Tensors `xs` of one shape as the rows of one new tensor, each in index order: end to end along
    their first dimension (a stack would make a view of each first), one row each (a copy only when the
    joined tensor keeps a layout of its own, channels-last)."""
    return (torch.cat(xs) if xs[0].dim() else torch.stack(xs)).reshape(len(xs), -1)


def _by_shape(items, limit):
    """({shape: items}, items of more than `limit` elements): the first element of an item is its tensor,
    the second its size."""
    shapes, alone = {}, []
    for item in items:
        if item[1] > limit:
            alone.append(item)
        else:
            group = shapes.get(item[0].shape)
            if group is None:
                shapes[item[0].shape] = [item]
            else:
                group.append(item)
    return shapes, alone


def _stats_one(x, slot):
    row = slot_row(slot)
    with torch.no_grad():
        if x.dtype == torch.bool:
            row.copy_(torch.stack((x.any(), x.all(), x.any(), x.any())))
            return
        if not x.is_floating_point() or x.dtype.itemsize == 1:  # ints, float8: exact in float64
            x = x.to(torch.float64)
        flat = x.reshape(-1)
        mn, mx = torch.aminmax(flat)
        # each result straight into its place in the row: five launches a tensor
        torch.stack((mx, mn), out=row[:2])
        torch.sum(flat, dim=0, dtype=torch.float64, out=row[2])
        torch.linalg.vector_norm(flat, dtype=torch.float64, out=row[3])
        row[3:].square_()


def checksum(batch):
    """Raw CRC-32 of items (x, slot) of one device and dtype (the bytes of `x` in index order): the small
    tensors of each shape stacked into rows of bytes, zero-padded in front to whole CRC rows, all shapes
    in one pass; the large ones a pass each."""
    x0 = batch[0][0]
    limit = GROUP_ELEMENTS.get(x0.device.type, GROUP_ELEMENTS_ELSEWHERE) * 4 // max(1, x0.element_size())
    shapes, alone = _by_shape([(x, x.numel(), slot) for x, slot in batch], limit)
    out = _Rows()
    device, pending = x0.device, _Pass(out)
    for items in shapes.values():
        nbytes = items[0][1] * x0.element_size()
        if nbytes <= ROW:  # a row each, its missing front columns zeros: no part of the raw CRC
            with torch.no_grad():
                xs, _, slots = zip(*items)
                m = _rows_of(xs).view(torch.uint8)
                out.add(slots, _crc_short(m).unsqueeze(1))
            continue
        pad = (-nbytes) % ROW
        r = (nbytes + pad) // ROW
        per = max(1, CRC_ROWS // r)  # tensors a pass
        for i in range(0, len(items), per):
            chunk = items[i:i + per]
            if pending.rows + r * len(chunk) > CRC_ROWS:
                pending.run(device)
            k = len(chunk)
            xs, _, slots = zip(*chunk)
            with torch.no_grad():
                m = _rows_of(xs).view(torch.uint8)
                if pad:
                    m = torch.cat((m.new_zeros((k, pad)), m), 1)
            pending.add(m.reshape(-1, ROW), r, slots)
    pending.run(device)
    out.store()
    for x, _, slot in alone:
        with torch.no_grad():
            slot_row(slot).copy_(crc_raw(x.contiguous().reshape(-1).view(torch.uint8)))


class _Pass:
    """Rows of bytes of several tensors (whole CRC rows, zero-padded in front) read in one CRC pass; the
    raw CRCs go to `out` (_Rows)."""

    def __init__(self, out):
        self.out = out
        self.parts, self.slots, self.segment, self.after, self.rows = [], [], [], [], 0

    def add(self, rows, per_tensor, slots):
        """`rows`: len(slots) tensors of `per_tensor` rows each, one after the other."""
        k = len(slots)
        self.parts.append(rows)
        self.segment.append(np.repeat(np.arange(len(self.slots), len(self.slots) + k, dtype=np.int64), per_tensor))
        self.after.append(np.tile(np.arange(per_tensor - 1, -1, -1, dtype=np.int64), k))
        self.slots.extend(slots)
        self.rows += rows.shape[0]

    def run(self, device):
        """The pass: each tensor's raw CRC into its slot; the pass starts anew."""
        if not self.parts:
            return
        with torch.no_grad():
            rows = self.parts[0] if len(self.parts) == 1 else torch.cat(self.parts)
            after = np.concatenate(self.after)
            idx = index_tensor(np.stack((np.concatenate(self.segment), after)), device)
            raws = _crc_rows(rows, idx[1], idx[0], len(self.slots), int(after.max()).bit_length())
        self.out.add(self.slots, raws.unsqueeze(1))
        self.parts, self.slots, self.segment, self.after, self.rows = [], [], [], [], 0


def crc_raw(raw):
    """Raw CRC-32 (register from 0, no final xor) of flat uint8 tensor `raw`, as a 1-element int64 tensor on
    its device. Up to one pass (CRC_ROWS rows) it is zero-padded in front to whole rows (a copy of a small
    tensor); beyond, read in passes from its own memory, the head of fewer than ROW bytes in a row of its own."""
    device, n = raw.device, raw.numel()
    head, full = n % ROW, n // ROW
    with torch.no_grad():
        if n <= CRC_ROWS * ROW:
            if head:
                raw = torch.cat((_zeros(device, ROW - head), raw))
            rows = raw.view(-1, ROW)
            count = rows.shape[0]
            after = None if count == 1 else torch.arange(count - 1, -1, -1, dtype=torch.int64, device=device)
            return _crc_rows(rows, after, None, 1, (count - 1).bit_length())
        out = torch.zeros(1, dtype=torch.int64, device=device)
        if head:
            row = torch.cat((_zeros(device, ROW - head), raw[:head]))
            out ^= _crc_rows(row.view(1, ROW), index_tensor([full], device), None, 1, full.bit_length())
        for r0 in range(0, full, CRC_ROWS):
            r1 = min(full, r0 + CRC_ROWS)
            rows = raw[head + r0 * ROW:head + r1 * ROW].view(-1, ROW)
            # rows after each: full - 1 - r0 for the first of the pass, down to full - r1
            after = torch.arange(full - 1 - r0, full - 1 - r1, -1, dtype=torch.int64, device=device)
            out ^= _crc_rows(rows, after, None, 1, (full - 1 - r0).bit_length())
    return out


def _zeros(device, n):
    z = _pads.get((device, n))
    if z is None:
        z = _pads[(device, n)] = torch.zeros(n, dtype=torch.uint8, device=device)
    return z


def _tables(device):
    tabs = _crc_tables.get(device)
    if tabs is None:
        # int32 holds a CRC's 32 bits (xor and masked shifts do not care about the sign)
        rt = torch.from_numpy(crc.row_tables(ROW).view(np.int32).reshape(-1))
        st = torch.from_numpy(crc.shift_tables(ROW).view(np.int32).reshape(crc.SHIFT_LEVELS, -1))
        cols = torch.arange(ROW, dtype=torch.int32) * 256
        nt = torch.from_numpy(crc.position_tables(ROW, NEAR).view(np.int32).reshape(-1))
        tabs = _crc_tables[device] = (to_device_async(rt, device), to_device_async(nt, device),
                                      to_device_async(st, device),
                                      to_device_async(cols, device),
                                      to_device_async(torch.arange(32, dtype=torch.int32), device),
                                      to_device_async(torch.arange(4, dtype=torch.int32) * 256, device))
    return tabs


def _crc_short(m):
    """(k,) int64 raw CRCs of the k rows of uint8 `m` (k, w), w <= ROW: each the last w columns of a CRC row."""
    row_tab, _, _, cols, _, _ = _tables(m.device)
    width = m.shape[1]
    vals = row_tab.index_select(0, (m + cols[ROW - width:]).view(-1)).view(m.shape)  # uint8 + int32: int32
    return _xor_columns(vals).to(torch.int64) & 0xFFFFFFFF


def _xor_columns(vals):
    """(k,) int32: the xor of the columns of each row of contiguous int32 `vals` (k, w), halving; pairs
    of columns folded as one int64 first (half the elements), the two halves of the last xored."""
    width = vals.shape[1]
    pairs = width % 2 == 0 and width > 2
    if pairs:
        vals, width = vals.view(torch.int64), width // 2
    while width > 1:  # an odd one out joins the first
        half = width // 2
        folded = vals[:, :half] ^ vals[:, half:2 * half]
        if width % 2:
            folded[:, :1] ^= vals[:, 2 * half:]
        vals, width = folded, half
    if pairs:
        halves = vals.contiguous().view(torch.int32)
        return halves[:, 0] ^ halves[:, 1]
    return vals[:, 0]


def _crc_rows(rows, after, segment, count, levels):
    """(count,) int64 raw CRCs: per segment, the xor of each uint8 row's raw CRC shifted by `after` rows
    (`segment` None: all rows are one; `after` None: there is one row); `levels`: the bits of the largest
    `after`."""
    row_tab, near_tab, shift_tab, cols, bits, quarters = _tables(rows.device)
    # (r, ROW): each byte's part of its row's raw CRC
    vals = row_tab.index_select(0, (rows + cols).view(-1)).view(rows.shape)  # uint8 + int32: int32
    u = _xor_columns(vals).contiguous()
    if after is None:
        return u.to(torch.int64) & 0xFFFFFFFF
    # rows fewer than NEAR from the end: one lookup of the CRC's four bytes (little-endian int32 memory)
    near = ((after & (NEAR - 1)) * 1024).to(torch.int32).unsqueeze(1) + quarters
    parts = near_tab.index_select(0, (u.view(torch.uint8).view(-1, 4).to(torch.int32) + near).view(-1)).view(-1, 4)
    u = (parts[:, 0] ^ parts[:, 1]) ^ (parts[:, 2] ^ parts[:, 3])
    if levels > _NEAR_BITS:  # farther: one level per higher bit of `after`
        moves = ((after.unsqueeze(1) >> bits[_NEAR_BITS:levels].to(torch.int64)) & 1).bool()
        for k in range(_NEAR_BITS, levels):
            idx = u.view(torch.uint8).view(-1, 4).to(torch.int32) + quarters
            parts = shift_tab[k].index_select(0, idx.view(-1)).view(-1, 4)
            u = torch.where(moves[:, k - _NEAR_BITS], (parts[:, 0] ^ parts[:, 1]) ^ (parts[:, 2] ^ parts[:, 3]), u)
    # xor per segment: each bit's count mod 2 (torch has no xor reduction)
    ones = ((u.unsqueeze(1) >> bits) & 1).to(torch.int64)
    if segment is None:
        counts = ones.sum(0, keepdim=True)
    else:
        counts = torch.zeros((count, 32), dtype=torch.int64, device=rows.device).index_add_(0, segment, ones)
    return ((counts & 1) << bits.to(torch.int64)).sum(1)


def _grouped(items, fits):
    """`items` (x, n, slot, rows) split into chunks to reduce together (small ones, at most GROUP_TOTAL
    elements a chunk) and the rest, one by one."""
    x0 = items[0][0]
    limit = GROUP_ELEMENTS.get(x0.device.type, GROUP_ELEMENTS_ELSEWHERE)
    chunks, alone, chunk, total = [], [], [], 0
    for item in items:
        n = item[1]
        if n > limit or len(items) == 1 or not fits(item):
            alone.append(item)
            continue
        if total + n > GROUP_TOTAL:
            chunks.append(chunk)
            chunk, total = [], 0
        chunk.append(item)
        total += n
    if len(chunk) > 1:
        chunks.append(chunk)
    else:
        alone.extend(chunk)
    return chunks, alone


class _Rows:
    """Rows of values computed for slots, part by part, stored into the slots' buffers together: one copy
    (or one indexed copy) per buffer for a whole batch, not one per group of it."""

    __slots__ = ("slots", "parts")

    def __init__(self):
        self.slots, self.parts = [], []

    def add(self, slots, values):
        """Row i of `values` is slot i's."""
        self.slots.extend(slots)
        self.parts.append(values)

    def store(self):
        if self.parts:
            _store_rows(self.slots, self.parts[0] if len(self.parts) == 1 else torch.cat(self.parts))
            self.slots, self.parts = [], []


def _store_rows(slots, values):
    """Row i of `values` into slot i's row of its buffer: one copy into consecutive rows of one buffer (slots
    made in order), else one indexed copy per buffer."""
    buf, start = slots[0]
    k = len(slots)
    buffers, index = zip(*slots)
    if buffers.count(buf) == k:  # one buffer (most batches)
        # (stacked and staged slots come grouped by shape or stage, not in row order)
        if index[-1] == start + k - 1 and index == tuple(range(start, start + k)):
            buf.rows[start:start + k].copy_(values)
        else:
            buf.rows.index_copy_(0, index_tensor(index, values.device), values)
        return
    by_buffer = {}
    for pos, (b, i) in enumerate(slots):
        got = by_buffer.get(b)
        if got is None:
            got = by_buffer[b] = ([], [])
        got[0].append(i)
        got[1].append(pos)
    device = values.device
    for b, (rows, picks) in by_buffer.items():
        b.rows.index_copy_(0, index_tensor(rows, device), values[index_tensor(picks, device)])

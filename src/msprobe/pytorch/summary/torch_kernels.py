"""The summary kernels in torch's own ops, on the tensor's device: what NPUs, CUDA without Triton and the
CPU path the tests force (`MSPROBE_DEVICE_SUMMARY=1`) run. A few launches a tensor; a batch of small
tensors of one dtype in a few launches in all (one concatenation, segment reductions).

Protocol (the same in triton_kernels.py): `statistics(batch)`, items (x, n, slot, rows): Max/Min/Sum/Sum
of squares of `x` (n elements; `rows` unused here) into the slot's row; `checksum(batch)`, items (raw,
slot): the raw CRC-32 of flat uint8 `raw` (core/checksum.py: rows of ROW bytes from the end, one table
lookup a byte, each row shifted by the rows after it, xored) into the slot's row.
"""

import numpy as np
import torch

from msprobe.core import checksum as crc
from msprobe.pytorch.summary.transfer import index_tensor, to_device_async

# deferred tensors of at most this many elements (by device type) are reduced together: one concatenation
# and segment reductions instead of five launches a tensor; on CPU the concatenation costs more than the
# launches it saves above a few thousand elements
GROUP_ELEMENTS = {"cpu": 2048}
GROUP_ELEMENTS_ELSEWHERE = 1 << 16
GROUP_TOTAL = 1 << 22  # elements per grouped reduction: float64 temporaries of 32 MB
# CRC rows a pass reads: bounds the temporaries (about 12 bytes a byte read) at 48 MB
CRC_ROWS = (4 << 20) // crc.ROW
_crc_tables = {}  # device -> (row table, shift tables, column offsets, bit numbers)


def handles(dtype):
    return True


def statistics(batch):
    """Statistics of items (x, n, slot, rows) of one device and dtype: the small ones concatenated (as
    float64, exact for every real dtype) and reduced by segment; segment_reduce where a device lacks it
    falls back to a tensor at a time."""
    chunks, alone = _grouped(batch, lambda item: True)
    for chunk in chunks:
        try:
            with torch.no_grad():
                lengths = index_tensor([n for _, n, _, _ in chunk], chunk[0][0].device)
                flat = torch.cat([x.reshape(-1) for x, _, _, _ in chunk]).to(torch.float64)
                # unsafe: the lengths are right by construction, and checking them reads them back
                values = torch.stack([torch.segment_reduce(flat, op, lengths=lengths, unsafe=True)
                                      for op in ("max", "min", "sum")]
                                     + [torch.segment_reduce(flat * flat, "sum", lengths=lengths, unsafe=True)], dim=1)
        except (RuntimeError, NotImplementedError):
            alone.extend(chunk)
            continue
        _store_rows([slot for _, _, slot, _ in chunk], values)
    for x, _, slot, _ in alone:
        _stats_one(x, slot)


def _stats_one(x, slot):
    row = slot.row
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
    """Raw CRC-32 of items (raw, slot) of one device: the small ones each zero-padded in front to whole
    rows and concatenated, one pass for all; the large ones a pass each, on their own memory."""
    chunks, alone = _grouped([(raw, raw.numel(), slot, None) for raw, slot in batch], lambda item: True)
    for chunk in chunks:
        device = chunk[0][0].device
        with torch.no_grad():
            pads = [(-n) % crc.ROW for _, n, _, _ in chunk]
            zeros = torch.zeros(crc.ROW, dtype=torch.uint8, device=device)
            parts = []
            for (raw, _, _, _), pad in zip(chunk, pads):
                if pad:
                    parts.append(zeros[:pad])
                parts.append(raw)
            rows = torch.cat(parts).view(-1, crc.ROW)
            counts = np.array([(n + pad) // crc.ROW for (_, n, _, _), pad in zip(chunk, pads)], dtype=np.int64)
            segment = np.repeat(np.arange(len(chunk), dtype=np.int64), counts)
            after = np.cumsum(counts)[segment] - 1 - np.arange(segment.size, dtype=np.int64)
            idx = index_tensor(np.stack((segment, after)), device)
            raws = _crc_rows(rows, idx[1], idx[0], len(chunk), int(counts.max() - 1).bit_length())
        _store_rows([slot for _, _, slot, _ in chunk], raws.unsqueeze(1))
    for raw, _, slot, _ in alone:
        slot.row.copy_(crc_raw(raw))


def crc_raw(raw):
    """Raw CRC-32 (register from 0, no final xor) of flat uint8 tensor `raw`, as a 1-element int64 tensor on
    its device, read from its memory in passes of CRC_ROWS rows; the head of fewer than ROW bytes is
    copied into a zero-padded row."""
    device, n, width = raw.device, raw.numel(), crc.ROW
    head, full = n % width, n // width
    out = torch.zeros(1, dtype=torch.int64, device=device)
    with torch.no_grad():
        if head:
            row = torch.cat((torch.zeros(width - head, dtype=torch.uint8, device=device), raw[:head]))
            out ^= _crc_rows(row.view(1, width), _const(full, device), None, 1, full.bit_length())
        for r0 in range(0, full, CRC_ROWS):
            r1 = min(full, r0 + CRC_ROWS)
            rows = raw[head + r0 * width:head + r1 * width].view(-1, width)
            # rows after each: full - 1 - r0 for the first of the pass, down to full - r1
            after = torch.arange(full - 1 - r0, full - 1 - r1, -1, dtype=torch.int64, device=device)
            out ^= _crc_rows(rows, after, None, 1, (full - 1 - r0).bit_length())
    return out


def _const(value, device):
    return index_tensor([value], device)


def _tables(device):
    tabs = _crc_tables.get(device)
    if tabs is None:
        # int32 holds a CRC's 32 bits (xor and masked shifts do not care about the sign)
        rt = torch.from_numpy(crc.row_tables().view(np.int32).reshape(-1))
        st = torch.from_numpy(crc.shift_tables().view(np.int32).reshape(crc.SHIFT_LEVELS, -1))
        cols = torch.arange(crc.ROW, dtype=torch.int32) * 256
        tabs = _crc_tables[device] = (to_device_async(rt, device), to_device_async(st, device),
                                      to_device_async(cols, device),
                                      to_device_async(torch.arange(32, dtype=torch.int32), device))
    return tabs


def _crc_rows(rows, after, segment, count, levels):
    """(count,) int64 raw CRCs: per segment, the xor of each uint8 row's raw CRC shifted by `after` rows
    (`segment` None: all rows are one); `levels`: the bits of the largest `after`."""
    row_tab, shift_tab, cols, bits = _tables(rows.device)
    # (r, ROW): each byte's part of its row's raw CRC
    vals = row_tab.index_select(0, (rows.to(torch.int32) + cols).view(-1)).view(rows.shape)
    width = vals.shape[1]
    while width > 1:  # xor of the columns, halving
        width //= 2
        vals = vals[:, :width] ^ vals[:, width:2 * width]
    u = vals[:, 0]
    for k in range(levels):
        tab = shift_tab[k]
        moved = (tab[u & 255] ^ tab[256 + ((u >> 8) & 255)] ^ tab[512 + ((u >> 16) & 255)]
                 ^ tab[768 + ((u >> 24) & 255)])
        u = torch.where(((after >> k) & 1).bool(), moved, u)
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


def _store_rows(slots, values):
    """Row i of `values` into slot i's row of its buffer: one indexed copy per buffer."""
    by_buffer = {}
    for i, slot in enumerate(slots):
        _, rows, picks = by_buffer.setdefault(id(slot.buffer), (slot.buffer, [], []))
        rows.append(slot.index)
        picks.append(i)
    device = values.device
    for buf, rows, picks in by_buffer.values():
        part = values if len(picks) == len(slots) else values[index_tensor(picks, device)]
        buf.rows.index_copy_(0, index_tensor(rows, device), part)

"""The summary kernels in torch's own ops, on the tensor's device: what NPUs, CUDA without Triton and the
CPU path the tests force (`MSPROBE_DEVICE_SUMMARY=1`) run. A few launches a tensor; a batch of small
tensors of one dtype in a few launches in all (one concatenation, segment reductions).

Protocol (the same in triton_kernels.py): `statistics(batch)`, items (x, n, slot, rows): Max/Min/Sum/Sum
of squares of `x` (n elements; `rows` unused here) into the slot's row; `checksum(batch)`, items (raw,
slot): the raw CRC-32 of flat uint8 `raw` (core/checksum.py: rows of ROW bytes from the end, one table
lookup a byte, each row shifted by the rows after it, xored) into the slot's row. Rows here are 1 KB
(Triton's are 64 bytes): a tensor of up to 1 KB is one row, a gather and ten xors, no shift; launches,
not bytes, are what a small tensor costs.
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
    # grouped by 32-bit words, as the statistics are by elements (the same bytes per launch saved)
    chunks, alone = _grouped([(raw, raw.numel() // 4, slot, None) for raw, slot in batch], lambda item: True)
    for chunk in chunks:
        device = chunk[0][0].device
        sizes = [raw.numel() for raw, _, _, _ in chunk]
        with torch.no_grad():
            pads = [(-n) % ROW for n in sizes]
            parts = []
            for (raw, _, _, _), pad in zip(chunk, pads):
                if pad:
                    parts.append(_zeros(device, pad))
                parts.append(raw)
            rows = torch.cat(parts).view(-1, ROW)
            counts = np.array([(n + pad) // ROW for n, pad in zip(sizes, pads)], dtype=np.int64)
            segment = np.repeat(np.arange(len(chunk), dtype=np.int64), counts)
            after = np.cumsum(counts)[segment] - 1 - np.arange(segment.size, dtype=np.int64)
            idx = index_tensor(np.stack((segment, after)), device)
            raws = _crc_rows(rows, idx[1], idx[0], len(chunk), int(counts.max() - 1).bit_length())
        _store_rows([slot for _, _, slot, _ in chunk], raws.unsqueeze(1))
    for raw, _, slot, _ in alone:
        slot.row.copy_(crc_raw(raw))


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


def _crc_rows(rows, after, segment, count, levels):
    """(count,) int64 raw CRCs: per segment, the xor of each uint8 row's raw CRC shifted by `after` rows
    (`segment` None: all rows are one; `after` None: there is one row); `levels`: the bits of the largest
    `after`."""
    row_tab, near_tab, shift_tab, cols, bits, quarters = _tables(rows.device)
    # (r, ROW): each byte's part of its row's raw CRC
    vals = row_tab.index_select(0, (rows.to(torch.int32) + cols).view(-1)).view(rows.shape)
    width = vals.shape[1]
    while width > 1:  # xor of the columns, halving
        width //= 2
        vals = vals[:, :width] ^ vals[:, width:2 * width]
    u = vals[:, 0].contiguous()
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

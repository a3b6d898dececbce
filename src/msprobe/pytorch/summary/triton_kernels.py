"""The summary kernels in Triton (CUDA), behind the protocol of torch_kernels.py: `statistics(batch)` and
`checksum(batch)` of one or many tensors in one launch.

Each program reduces its share of a tensor and writes a partial row to scratch memory; the program that
finishes last (an acquire-release counter per tensor) reduces the partial rows in a fixed order into the
tensor's slot and resets the counter. One pass over the data, the same numbers every run (no
floating-point atomics). The checksum is CRC-32 by rows (core/checksum.py): a program reads rows of ROW
bytes counted from the tensor's end, looks each byte up in the row table, xors a row's entries, shifts
the row's raw CRC by the rows after it (a shift table per bit) and xors its rows; the last program xors
the programs' parts. Integer specialisation is off for the sizes and indices that change from call to call
(`do_not_specialize`): a new value must not compile a new kernel. Importing this module imports Triton:
an ImportError tells the caller to use torch_kernels.
"""

import numpy as np
import torch
import triton
import triton.language as tl

from msprobe.core import checksum as crc
from msprobe.pytorch.summary.slots import address
from msprobe.pytorch.summary.transfer import table_to_device, to_device_async

BLOCK = 2048
MAX_PROGRAMS = 1024  # partial rows a slot may use; the last program reduces them in one load
RING_ROWS = 16 * MAX_PROGRAMS
_KINDS = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool)
_scratch = {}  # device -> [float64 ring, counters, next row]
ROW = crc.ROW
CRC_RB = 32  # rows of ROW bytes a block of the CRC kernel reads
_crc = {}  # device -> (row table, shift tables) as int64


def handles(dtype):
    return dtype in _KINDS


def _state(device, slots):
    st = _scratch.get(device)
    if st is None or st[1].numel() < slots:
        st = _scratch[device] = [torch.empty((RING_ROWS, 4), dtype=torch.float64, device=device),
                                 torch.zeros(max(slots, 4096), dtype=torch.int32, device=device), 0]
    return st


def _programs(n):
    return max(1, min(triton.cdiv(n, BLOCK), MAX_PROGRAMS))


def _ring_rows(st, programs):
    row = st[2]
    if row + programs > RING_ROWS:  # the ring is reused in stream order: earlier launches are done with it
        row = 0
    st[2] = row + programs
    return row


def statistics(batch):
    """Statistics of items (x, n, slot, rows) of one device and dtype: `x` dense, or rows of a wider
    tensor when `rows` is (columns, row stride); one tensor alone by the ring kernel."""
    if len(batch) == 1 and batch[0][3] is None:
        x, n, (buf, index), _ = batch[0]
        stats(x, n, buf.rows, index)
        return
    stats_many([x for x, _, _, _ in batch], [n for _, n, _, _ in batch], [address(slot) for _, _, slot, _ in batch],
               [r or (n, n) for _, n, _, r in batch])


def checksum(batch):
    """Raw CRC-32 of items (x, slot), the bytes of tensors of one device in index order, in one launch."""
    raws = [x if x.is_contiguous() else x.contiguous() for x, _ in batch]  # alive until launched
    raw0 = raws[0]
    counts = [buf.nbytes[i] for _, (buf, i) in batch]
    levels = [max(0, -(-n // ROW) - 1).bit_length() for n in counts]
    table, tiles = _table(raw0.device, [raw.data_ptr() for raw in raws], counts,
                          [address(slot) for _, slot in batch], CRC_TILE, (levels,))
    st = _multi_state(raw0.device, tiles, len(batch))
    row_tab, shift_tab = _crc_tables(raw0.device)
    _crc_multi_kernel[(tiles,)](table, len(batch), st[1], st[2], row_tab, shift_tab, ROW=ROW, RB=CRC_RB,
                                TILE_BLOCKS=TILE_BLOCKS, MAXP=MAX_PROGRAMS, num_warps=4)


def _crc_tables(device):
    tabs = _crc.get(device)
    if tabs is None:
        tabs = _crc[device] = (
            to_device_async(torch.from_numpy(crc.row_tables().astype(np.int64)), device),
            to_device_async(torch.from_numpy(crc.shift_tables().astype(np.int64)), device))
    return tabs


def stats(x, n, out, index):
    """Max/Min/Sum/Sum of squares of the `n` elements of contiguous `x` into `out[index]` (float64 x 4)."""
    st = _state(x.device, out.shape[0])
    p = _programs(n)
    row = _ring_rows(st, p)
    _stats_kernel[(p,)](x, n, st[0], row, st[1], out, index, BLOCK=BLOCK, MAXP=MAX_PROGRAMS, num_warps=8)


@triton.jit
def _fold_stats(v, m, mx, mn, s, q, nan):
    """One block of float64 values `v` (lanes where `m`) into the running max, min, sums and NaN flag."""
    mx = tl.where(m & (v > mx), v, mx)  # NaN never wins a comparison: it is counted below
    mn = tl.where(m & (v < mn), v, mn)
    return mx, mn, s + v, q + v * v, nan | (v != v).to(tl.int32)


@triton.jit
def _store_stats_part(part, mx, mn, s, q, nan):
    """A program's partial row: max, min, sum, sum of squares (NaN when any value was NaN)."""
    tl.store(part + 0, tl.max(mx, 0))
    tl.store(part + 1, tl.min(mn, 0))
    tl.store(part + 2, tl.sum(s, 0))
    tl.store(part + 3, tl.sum(q, 0) + tl.where(tl.max(nan, 0) > 0, float("nan"), 0.0))


@triton.jit(do_not_specialize=["n", "ring_row", "index"])
def _stats_kernel(x_ptr, n, ring_ptr, ring_row, count_ptr, out_ptr, index, BLOCK: tl.constexpr,
                  MAXP: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    mx = tl.full([BLOCK], float("-inf"), tl.float64)
    mn = tl.full([BLOCK], float("inf"), tl.float64)
    s = tl.zeros([BLOCK], tl.float64)
    q = tl.zeros([BLOCK], tl.float64)
    nan = tl.zeros([BLOCK], tl.int32)
    for start in range(pid.to(tl.int64) * BLOCK, n, nprog * BLOCK):
        offs = start + lanes
        m = offs < n
        v = tl.load(x_ptr + offs, mask=m, other=0).to(tl.float64)
        mx, mn, s, q, nan = _fold_stats(v, m, mx, mn, s, q, nan)
    _store_stats_part(ring_ptr + (ring_row + pid) * 4, mx, mn, s, q, nan)
    done = tl.atomic_add(count_ptr + index, 1, sem="acq_rel")
    if done == nprog - 1:
        p = tl.arange(0, MAXP)
        pm = p < nprog
        rows = ring_ptr + (ring_row + p) * 4
        qs = tl.load(rows + 3, mask=pm, other=0.0)
        has_nan = tl.sum((qs != qs).to(tl.int32), 0) > 0
        gmx = tl.max(tl.load(rows + 0, mask=pm, other=float("-inf")), 0)
        gmn = tl.min(tl.load(rows + 1, mask=pm, other=float("inf")), 0)
        o = out_ptr + index * 4
        tl.store(o + 0, tl.where(has_nan, float("nan"), gmx))
        tl.store(o + 1, tl.where(has_nan, float("nan"), gmn))
        tl.store(o + 2, tl.sum(tl.load(rows + 2, mask=pm, other=0.0), 0))
        tl.store(o + 3, tl.sum(qs, 0))
        tl.store(count_ptr + index, 0)


# -- many tensors in one launch -------------------------------------------------------------------------
# A batch of same-dtype tensors is cut into tiles of TILE elements; the program of a tile writes its partial
# row, and the last tile of each tensor to finish reduces that tensor's rows into its slot. The host builds
# one int64 table: per tensor its address, element count, slot address, first tile, tile count, columns and
# row stride (a row-strided layout; dense: both n), then the tensor of every tile.
TILE_BLOCKS = 8
TILE = BLOCK * TILE_BLOCKS
CRC_TILE = ROW * CRC_RB * TILE_BLOCKS  # bytes a CRC tile reads
_TL_TYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16,
             torch.float64: tl.float64, torch.int8: tl.int8, torch.uint8: tl.uint8, torch.int16: tl.int16,
             torch.int32: tl.int32, torch.int64: tl.int64, torch.bool: tl.int8}
_multi = {}  # device -> [float64 partial rows, int64 partial rows, tile counters]


def _multi_state(device, tiles, tensors):
    st = _multi.get(device)
    if st is None or st[0].shape[0] < tiles or st[2].numel() < tensors:
        rows = max(tiles, 4096 if st is None else 2 * st[0].shape[0])
        count = max(tensors, 1024 if st is None else 2 * st[2].numel())
        st = _multi[device] = [torch.empty((rows, 4), dtype=torch.float64, device=device),
                               torch.empty((rows, 2), dtype=torch.int64, device=device),
                               torch.zeros(count, dtype=torch.int32, device=device)]
    return st


def _table(device, addrs, counts, outs, per_tile, extra):
    """The batch's table on the device (one copy from a reused pinned buffer) and its tile count: per tensor
    its address, element count, slot address, first tile, tile count and the `extra` columns, then the
    tensor of every tile."""
    k = len(addrs)
    counts = np.asarray(counts, dtype=np.int64)
    tiles = np.maximum(1, -(-counts // per_tile))
    first = np.concatenate(([0], np.cumsum(tiles)[:-1]))
    table = np.concatenate([np.asarray(addrs, dtype=np.int64), counts, np.asarray(outs, dtype=np.int64),
                            first, tiles] + [np.asarray(e, dtype=np.int64) for e in extra]
                           + [np.repeat(np.arange(k, dtype=np.int64), tiles)])
    # (on the CPU: Triton's interpreter, in the tests)
    return table_to_device(table, device), int(tiles.sum())


def stats_many(tensors, counts, outs, rows):
    """Statistics of many same-dtype tensors in one launch; `outs` are the slot addresses (float64 x 4
    each), `rows` per tensor (columns, row stride) of its memory (dense: (n, n))."""
    x0 = tensors[0]
    table, tiles = _table(x0.device, [t.data_ptr() for t in tensors], counts, outs, TILE,
                          ([r[0] for r in rows], [r[1] for r in rows]))
    st = _multi_state(x0.device, tiles, len(tensors))
    _stats_multi_kernel[(tiles,)](table, len(tensors), st[0], st[2], DTYPE=_TL_TYPES[x0.dtype], BLOCK=BLOCK,
                                  TILE_BLOCKS=TILE_BLOCKS, MAXP=MAX_PROGRAMS, num_warps=8)


@triton.jit(do_not_specialize=["k"])
def _stats_multi_kernel(table_ptr, k, parts_ptr, count_ptr, DTYPE: tl.constexpr, BLOCK: tl.constexpr,
                        TILE_BLOCKS: tl.constexpr, MAXP: tl.constexpr):
    tile = tl.program_id(0)
    i = tl.load(table_ptr + 7 * k + tile)
    n = tl.load(table_ptr + k + i)
    first = tl.load(table_ptr + 3 * k + i)
    ntiles = tl.load(table_ptr + 4 * k + i)
    cols = tl.load(table_ptr + 5 * k + i)
    row_stride = tl.load(table_ptr + 6 * k + i)
    x_ptr = tl.load(table_ptr + i).to(tl.pointer_type(DTYPE))
    lanes = tl.arange(0, BLOCK)
    mx = tl.full([BLOCK], float("-inf"), tl.float64)
    mn = tl.full([BLOCK], float("inf"), tl.float64)
    s = tl.zeros([BLOCK], tl.float64)
    q = tl.zeros([BLOCK], tl.float64)
    nan = tl.zeros([BLOCK], tl.int32)
    base = (tile - first) * (BLOCK * TILE_BLOCKS)
    for b in range(TILE_BLOCKS):
        offs = base + b * BLOCK + lanes
        m = offs < n
        if cols == n:
            addr = offs
        else:  # rows of `cols` elements, `row_stride` apart (a chunk of a wider tensor)
            addr = (offs // cols) * row_stride + offs % cols
        v = tl.load(x_ptr + addr, mask=m, other=0).to(tl.float64)
        mx, mn, s, q, nan = _fold_stats(v, m, mx, mn, s, q, nan)
    _store_stats_part(parts_ptr + tile * 4, mx, mn, s, q, nan)
    done = tl.atomic_add(count_ptr + i, 1, sem="acq_rel")
    if done == ntiles - 1:
        gmx = tl.full([MAXP], float("-inf"), tl.float64)
        gmn = tl.full([MAXP], float("inf"), tl.float64)
        gs = tl.zeros([MAXP], tl.float64)
        gq = tl.zeros([MAXP], tl.float64)
        p = tl.arange(0, MAXP)
        for c in range(0, ntiles, MAXP):
            pm = c + p < ntiles
            rows = parts_ptr + (first + c + p) * 4
            gmx = tl.maximum(gmx, tl.load(rows + 0, mask=pm, other=float("-inf")))
            gmn = tl.minimum(gmn, tl.load(rows + 1, mask=pm, other=float("inf")))
            gs += tl.load(rows + 2, mask=pm, other=0.0)
            gq += tl.load(rows + 3, mask=pm, other=0.0)
        qs = tl.sum(gq, 0)
        has_nan = qs != qs
        o = tl.load(table_ptr + 2 * k + i).to(tl.pointer_type(tl.float64))
        tl.store(o + 0, tl.where(has_nan, float("nan"), tl.max(gmx, 0)))
        tl.store(o + 1, tl.where(has_nan, float("nan"), tl.min(gmn, 0)))
        tl.store(o + 2, tl.sum(gs, 0))
        tl.store(o + 3, qs)
        tl.store(count_ptr + i, 0)




@triton.jit(do_not_specialize=["k"])
def _crc_multi_kernel(table_ptr, k, parts_ptr, count_ptr, row_tab, shift_tab, ROW: tl.constexpr,
                      RB: tl.constexpr, TILE_BLOCKS: tl.constexpr, MAXP: tl.constexpr):
    tile = tl.program_id(0)
    i = tl.load(table_ptr + 6 * k + tile)
    n = tl.load(table_ptr + k + i)
    first = tl.load(table_ptr + 3 * k + i)
    ntiles = tl.load(table_ptr + 4 * k + i)
    levels = tl.load(table_ptr + 5 * k + i)
    x_ptr = tl.load(table_ptr + i).to(tl.pointer_type(tl.uint8))
    cols = tl.arange(0, ROW)
    acc = tl.zeros([RB], tl.int64)
    for b in range(TILE_BLOCKS):
        # rows counted from the tensor's end: row q holds bytes n - ROW*(q+1) .. n - ROW*q - 1
        q = ((tile - first) * TILE_BLOCKS + b) * RB + tl.arange(0, RB).to(tl.int64)
        offs = n - ROW * (q[:, None] + 1) + cols[None, :]
        m = offs >= 0  # the first row's missing bytes are leading zeros: no part of the raw CRC
        v = tl.load(x_ptr + offs, mask=m, other=0).to(tl.int64)
        u = tl.xor_sum(tl.load(row_tab + cols[None, :] * 256 + v), axis=1)
        for lv in range(levels):
            t = shift_tab + lv * 1024
            moved = (tl.load(t + (u & 255)) ^ tl.load(t + 256 + ((u >> 8) & 255))
                     ^ tl.load(t + 512 + ((u >> 16) & 255)) ^ tl.load(t + 768 + ((u >> 24) & 255)))
            u = tl.where(((q >> lv) & 1) != 0, moved, u)
        acc = acc ^ u
    tl.store(parts_ptr + tile * 2, tl.xor_sum(acc, axis=0))
    done = tl.atomic_add(count_ptr + i, 1, sem="acq_rel")
    if done == ntiles - 1:
        g = tl.zeros([MAXP], tl.int64)
        p = tl.arange(0, MAXP)
        for c in range(0, ntiles, MAXP):
            pm = c + p < ntiles
            g = g ^ tl.load(parts_ptr + (first + c + p) * 2, mask=pm, other=0)
        o = tl.load(table_ptr + 2 * k + i).to(tl.pointer_type(tl.int64))
        tl.store(o, tl.xor_sum(g, axis=0))
        tl.store(count_ptr + i, 0)

"""Triton kernels for pytorch/device_summary.py: a tensor's statistics, or its checksum, in one launch.

Each program reduces a strided share of the tensor's blocks and writes its partial row to a scratch
ring; the program that finishes last (an acquire-release counter per slot) reduces the partial rows in
a fixed order into the slot, and resets the counter. One pass over the tensor, one launch, the same
numbers every run (no floating-point atomics). Importing this module imports Triton: an ImportError
tells device_summary to use torch's reductions.
"""

import torch
import triton
import triton.language as tl

from msprobe.core import checksum

BLOCK = 2048
MAX_PROGRAMS = 1024  # partial rows a slot may use; the last program reduces them in one load
RING_ROWS = 16 * MAX_PROGRAMS
_KINDS = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool)
_scratch = {}  # device -> [float64 ring, int64 ring, counters, next row]


def handles(dtype):
    return dtype in _KINDS


def _state(device, slots):
    st = _scratch.get(device)
    if st is None or st[2].numel() < slots:
        st = _scratch[device] = [torch.empty((RING_ROWS, 4), dtype=torch.float64, device=device),
                                 torch.empty((RING_ROWS, 2), dtype=torch.int64, device=device),
                                 torch.zeros(max(slots, 4096), dtype=torch.int32, device=device), 0]
    return st


def _programs(n):
    return max(1, min(triton.cdiv(n, BLOCK), MAX_PROGRAMS))


def _ring_rows(st, programs):
    row = st[3]
    if row + programs > RING_ROWS:  # the ring is reused in stream order: earlier launches are done with it
        row = 0
    st[3] = row + programs
    return row


def stats(x, n, out, index):
    """Max/Min/Sum/Sum of squares of the `n` elements of contiguous `x` into `out[index]` (float64 x 4)."""
    st = _state(x.device, out.shape[0])
    p = _programs(n)
    row = _ring_rows(st, p)
    _stats_kernel[(p,)](x, n, st[0], row, st[2], out, index, BLOCK=BLOCK, MAXP=MAX_PROGRAMS, num_warps=8)


def wordsum(words, out, index):
    """The checksum's two 32-bit sums of int32 `words` (the bytes, contiguous) into `out[index]` (int64 x 2)."""
    n = words.numel()
    st = _state(words.device, out.shape[0])
    p = _programs(n)
    row = _ring_rows(st, p)
    _wordsum_kernel[(p,)](words, n, st[1], row, st[2], out, index, BLOCK=BLOCK, MAXP=MAX_PROGRAMS,
                          K0=checksum.K0, K1=checksum.K1, K2=checksum.K2, K3=checksum.K3, num_warps=8)


@triton.jit
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
        mx = tl.where(m & (v > mx), v, mx)  # NaN never wins a comparison: it is counted below
        mn = tl.where(m & (v < mn), v, mn)
        s += v
        q += v * v
        nan |= (v != v).to(tl.int32)
    part = ring_ptr + (ring_row + pid) * 4
    tl.store(part + 0, tl.max(mx, 0))
    tl.store(part + 1, tl.min(mn, 0))
    tl.store(part + 2, tl.sum(s, 0))
    tl.store(part + 3, tl.sum(q, 0) + tl.where(tl.max(nan, 0) > 0, float("nan"), 0.0))
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


@triton.jit
def _mix(a, K1: tl.constexpr, K2: tl.constexpr):
    a = a ^ (a >> 16)
    a = a * K1
    a = a ^ (a >> 15)
    a = a * K2
    return a ^ (a >> 16)


@triton.jit
def _wordsum_kernel(w_ptr, n, ring_ptr, ring_row, count_ptr, out_ptr, index, BLOCK: tl.constexpr,
                    MAXP: tl.constexpr, K0: tl.constexpr, K1: tl.constexpr, K2: tl.constexpr,
                    K3: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    s1 = tl.zeros([BLOCK], tl.uint32)
    s2 = tl.zeros([BLOCK], tl.uint32)
    for start in range(pid.to(tl.int64) * BLOCK, n, nprog * BLOCK):
        offs = start + lanes
        m = offs < n
        w = tl.load(w_ptr + offs, mask=m, other=0).to(tl.uint32, bitcast=True)
        a = _mix(w ^ (offs.to(tl.uint32) * K0), K1, K2)  # uint32 arithmetic wraps mod 2^32
        b = a * K3
        b = b ^ (b >> 13)
        s1 += tl.where(m, a, 0)
        s2 += tl.where(m, b, 0)
    part = ring_ptr + (ring_row + pid) * 2
    tl.store(part + 0, tl.sum(s1, 0).to(tl.int64))
    tl.store(part + 1, tl.sum(s2, 0).to(tl.int64))
    done = tl.atomic_add(count_ptr + index, 1, sem="acq_rel")
    if done == nprog - 1:
        p = tl.arange(0, MAXP)
        pm = p < nprog
        rows = ring_ptr + (ring_row + p) * 2
        o = out_ptr + index * 2
        tl.store(o + 0, tl.sum(tl.load(rows + 0, mask=pm, other=0), 0) & 0xFFFFFFFF)
        tl.store(o + 1, tl.sum(tl.load(rows + 1, mask=pm, other=0), 0) & 0xFFFFFFFF)
        tl.store(count_ptr + index, 0)

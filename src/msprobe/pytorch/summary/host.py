"""CPU tensors summarized at once: Max/Min/Mean/Norm in one pass of the C kernel (float32, float64,
bfloat16, int64, int32; core/dump/moments.py) or torch's reductions, and the CRC-32 with ISA-L on the tensor's memory (a
view as its dense runs in index order, core/checksum.py).

Conventions (msprobe-facts §3.2): bool -> Max=any, Min=all, Mean/Norm null; complex -> statistics of
|x|; empty -> all null; sums of fp16/bf16 in float64 (no overflow of the norm in fp16, no drift).
Without the kernel (other dtypes, a NaN or inf in the tensor): aminmax, sum and dot on the flat memory
(Mean = sum/n, Norm = sqrt(dot)); a transposed view is reduced in memory order, not element order.
"""

import math

import numpy as np
import torch

from msprobe.core.checksum import crc32_hex_at, crc32_hex_strided
from msprobe.core.dump import moments as native
from msprobe.core.dump.json_append import json_float
from msprobe.pytorch.summary.layout import element_span, memory_order
from msprobe.pytorch.summary.transfer import host_copy

_LOW_FLOATS = (torch.float16, torch.bfloat16)
# integer tensors up to this size are summarised in Python (one tolist) instead of torch reductions
_SMALL_INTS = 64
# below this many elements (512 KB of float32) the kernel reads on one thread: handing a smaller read to
# torch's OpenMP team (still spinning from the op that made the tensor) saves less than it costs
PARALLEL_MIN = 128 * 1024
kernel = native.kernel  # (None when not built or MSPROBE_NATIVE_STATS=0)
NATIVE_KINDS = {torch.float32: native.KINDS["float32"], torch.float64: native.KINDS["float64"],
                torch.bfloat16: native.KINDS["bfloat16"], torch.int64: native.KINDS["int64"],
                torch.int32: native.KINDS["int32"]}


def statistics(t, n, span, native_kinds):
    """Max/Min/Mean/Norm of CPU tensor `t` of `n` elements now; `span` is `element_span(t)` when the
    caller has it; `native_kinds`: the dtypes the C kernel may read (empty: torch's reductions only)."""
    if n == 0:
        return {"Max": None, "Min": None, "Mean": None, "Norm": None}
    if t.layout is not torch.strided:  # sparse (an embedding's sparse gradient), mkldnn
        return _other_layout(t, n, native_kinds)
    kind = native_kinds.get(t.dtype)
    if kind is not None and t.is_cpu:
        if span is None:
            span = ((1, n),) if t.is_contiguous() else element_span(t)
        got = None
        # As many kernel threads as torch's intra-op pool has now (a forked worker set to one must
        # get one: libgomp's team does not survive fork). The kernel's OpenMP team is torch's own
        # (the same libgomp), whose workers still spin from the op that made the tensor.
        threads = torch.get_num_threads() if n >= PARALLEL_MIN else 1
        # one dense run (contiguous or a transpose), or rows of runs (a slice of a wider tensor)
        if len(span) == 1 and span[0][0] == 1:
            got = kernel(t.data_ptr(), n, kind, threads)
        elif len(span) == 2 and span[1][0] == 1 and span[0][0] >= span[1][1]:  # rows do not overlap
            got = kernel(t.data_ptr(), span[1][1], kind, threads, span[0][1], span[0][0])
        if got is not None:  # None: a NaN or inf is in there (torch's reductions say how), or other layouts
            return {"Max": got[0], "Min": got[1], "Mean": got[2], "Norm": got[3]}  # (native.stats_record, inline)
    x = t.detach()
    with torch.no_grad():
        if x.is_quantized:  # the values it stands for (torch's reductions take no quantized dtype)
            x = x.dequantize()
        if x.dtype == torch.bool:
            return {"Max": bool(x.any()), "Min": bool(x.all()), "Mean": None, "Norm": None}
        if x.is_complex():
            x = x.abs()
        x = memory_order(x)
        if not x.is_floating_point():
            if n <= _SMALL_INTS:
                # a step counter, class labels: Python's exact ints beat five torch reductions here
                vals = x.reshape(-1).tolist()
                return {"Max": max(vals), "Min": min(vals), "Mean": sum(vals) / n,
                        "Norm": math.sqrt(sum(v * v for v in vals))}
            mn, mx = torch.aminmax(x)
            xf = x.to(torch.float64)
            mean, norm = xf.sum() / n, torch.linalg.vector_norm(xf)
            return {"Max": mx.item(), "Min": mn.item(), "Mean": mean.item(), "Norm": norm.item()}
        if x.dtype.itemsize == 1:  # float8: few kernels take it
            x = x.float()
        flat = x.view(-1) if x.is_contiguous() else None
        mn, mx = torch.aminmax(x if flat is None else flat)
        if x.dtype in _LOW_FLOATS or flat is None:
            # fp16/bf16 summed in float64, as the C kernel and the device kernels do: float32 sums of
            # millions of elements drift by 1e-4 (and the CPU and GPU dumps would disagree)
            total = x.sum(dtype=torch.float64) if x.dtype in _LOW_FLOATS else x.sum()
            norm = torch.linalg.vector_norm(x, dtype=torch.float64 if x.dtype in _LOW_FLOATS else None)
            squared = False
        else:
            total, norm, squared = flat.sum(), torch.dot(flat, flat), True
        return _finish((mx.item(), mn.item(), total.item(), norm.item()), n, squared, x)


def _finish(vals, n, squared, x):
    mx, mn, total, norm = vals
    if squared:
        if x is not None and math.isinf(norm) and math.isfinite(mx) and math.isfinite(mn):
            norm = torch.linalg.vector_norm(x, dtype=torch.float64).item()  # the squares overflowed
        else:
            norm = math.sqrt(norm) if norm == norm else norm
    if x is not None and math.isinf(total) and math.isfinite(mx) and math.isfinite(mn):
        total = x.sum(dtype=torch.float64).item()
    mean = total / n
    if math.isfinite(mx) and math.isfinite(mn) and math.isfinite(mean) and math.isfinite(norm):
        return {"Max": mx, "Min": mn, "Mean": mean, "Norm": norm}
    return {"Max": json_float(mx), "Min": json_float(mn), "Mean": json_float(mean), "Norm": json_float(norm)}


_SPARSE = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


def _other_layout(t, n, native_kinds):
    """Statistics of a sparse or mkldnn tensor: those of the dense tensor it stands for. A sparse one's
    come from its stored values (coalesced: duplicate indices summed) and, where it stores fewer than
    its `n` elements, the zeros elsewhere: no dense copy of an embedding table's gradient."""
    x = t.detach()
    if x.layout not in _SPARSE:
        return statistics(x.to_dense(), n, None, native_kinds)
    if x.layout is torch.sparse_coo:
        x = x.coalesce()
    values = x.values().reshape(-1)
    stored = values.numel()
    if stored == 0:
        values, stored = torch.zeros(1, dtype=x.dtype, device=x.device), 1
    got = statistics(values.contiguous(), stored, None, native_kinds)
    if stored >= n:
        return got
    if x.dtype == torch.bool:
        return dict(got, Min=False)
    mx, mn = (float(v) if isinstance(v, str) else v for v in (got["Max"], got["Min"]))
    mean = got["Mean"]
    if mean is not None:  # the stored values' sum over all n elements, rounded as the kernel rounds
        mean = values.sum(dtype=torch.float64).item() / n
        if x.dtype in (torch.float32, torch.bfloat16):
            mean = float(np.float32(mean))
    # the zeros elsewhere: a NaN stays what torch's reductions make of it
    return {"Max": json_float(mx if mx != mx else max(mx, 0)), "Min": json_float(mn if mn != mn else min(mn, 0)),
            "Mean": json_float(mean), "Norm": got["Norm"]}


def crc32_of(t):
    """CRC-32 of `t`'s elements in index order, in its dtype, as 8 hex digits (the "md5" field: what
    msProbe writes for the same tensor); read in place when `t` is a CPU tensor whose memory holds its
    values (a view as its dense runs), else from a contiguous copy."""
    if t.layout is not torch.strided:  # sparse, mkldnn: the elements of the dense tensor it stands for
        t = t.to_dense()
    plain = t.is_cpu and not (t.is_conj() or t.is_neg())
    n = t.numel()
    # as many threads as the statistics kernel takes (torch's, idle while the training thread reads)
    threads = torch.get_num_threads() if n >= PARALLEL_MIN else 1
    if plain:
        got = crc32_hex_strided(t.data_ptr(), t.element_size(), t.shape, t.stride(), threads)
        if got is not None:
            return got
    if not (plain and t.is_contiguous()):
        t = host_copy(t).resolve_conj().resolve_neg()
    # `t` holds the memory for the call
    return crc32_hex_at(t.data_ptr(), n * t.element_size(), threads)

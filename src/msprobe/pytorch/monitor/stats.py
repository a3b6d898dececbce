"""Configured ops of torch tensors, computed on the tensor's device without a host sync.

Each tensor costs one pass per op over its elements and nothing that scales with the number of tensors
on the host: `mean` and `zeros` are taken as a sum and a count and divided on the host; `nans` on a CPU
tensor is counted only when one of the other ops came out non-finite (NaN propagates through them, and
reading a CPU scalar costs no device sync). `StatsBatch` keeps every vector on its device and moves
them to the host in one `.tolist()` per device at step end. Guarded by `benchmarks/monitor_overhead.py`.
"""

import math

import torch

from msprobe.core.monitor.records import MetricRow

# ops whose raw on-device value is a sum or count, divided by the element count on the host
_PER_ELEMENT = ("mean", "zeros")
_NAN_PROPAGATING = ("norm", "min", "max", "mean")


class TensorStats:
    """Computes `ops` (names from `msprobe.core.monitor.ops.OPS`) of tensors.

    Args:
        ops: op names in output order.
        eps: |x| below it counts for `zeros`.
    """

    def __init__(self, ops, eps):
        self.ops = tuple(ops)
        self.eps = eps
        self._scratch = {}  # (device, dtype) -> reusable flat buffer for |x| < eps (no page faults per call)
        self._nan_probe = next((op for op in self.ops if op in _NAN_PROPAGATING), None)

    def _buffer(self, t, dtype):
        key = (t.device, dtype)
        buf = self._scratch.get(key)
        if buf is None or buf.numel() < t.numel():
            buf = torch.empty(max(t.numel(), 1 << 16), dtype=dtype, device=t.device)
            self._scratch[key] = buf
        return buf[:t.numel()].view(t.shape)

    def _zeros_count(self, t):
        # |x| and the comparison land in one reused float buffer: writing a bool mask (or counting one with
        # count_nonzero) is several times slower on CPU than an in-place lt_ and a float sum.
        flags = torch.abs(t, out=self._buffer(t, t.dtype)).lt_(self.eps)
        exact = torch.float32 if t.numel() < (1 << 24) else torch.float64   # counts stay exact integers
        return flags.sum(dtype=exact)

    @torch.no_grad()
    def raw(self, t):
        """One tensor -> float32 vector of its raw ops (sums and counts for mean/zeros), on its device."""
        t = t.detach()
        if t.numel() == 0:
            return torch.tensor([0.0 if op in ("nans", "zeros") else math.nan for op in self.ops],
                                device=t.device)
        if not t.is_floating_point():
            t = t.float()
        got = {}
        if "min" in self.ops or "max" in self.ops:
            got["min"], got["max"] = torch.aminmax(t)
        if "norm" in self.ops:
            got["norm"] = torch.linalg.vector_norm(t, dtype=torch.float32)
        if "mean" in self.ops:
            got["mean"] = t.sum(dtype=torch.float32)
        if "zeros" in self.ops:
            got["zeros"] = self._zeros_count(t)
        if "nans" in self.ops:
            if t.device.type == "cpu" and self._nan_probe and math.isfinite(got[self._nan_probe].item()):
                got["nans"] = torch.zeros((), dtype=torch.float32)
            else:
                got["nans"] = torch.count_nonzero(torch.isnan(t))
        return torch.stack([got[op].to(torch.float32) for op in self.ops])

    def finish(self, values, numel):
        """Host side of `raw`: divide sums and counts by the element count."""
        if numel == 0:
            return values
        return [v / numel if op in _PER_ELEMENT else v for op, v in zip(self.ops, values)]

    def of(self, t):
        """One tensor -> its ops as host floats (syncs; for tests and one-off use)."""
        return self.finish(self.raw(t).tolist(), t.numel())

    @torch.no_grad()
    def raw_many(self, tensors):
        """Many tensors -> float32 matrix [len(tensors), len(ops)] of raw ops; norms and maxima in foreach
        kernels when the tensors share a float dtype and device."""
        ts = [t.detach() for t in tensors]
        # foreach kernels reduce in the tensors' own dtype: only float32/float64 groups take them, so bf16/fp16
        # norms are still accumulated in float32 (per tensor)
        uniform = all(t.dtype in (torch.float32, torch.float64) and t.numel() > 0 and t.dtype == ts[0].dtype
                      and t.device == ts[0].device for t in ts)
        if not uniform or not ts or ("nans" in self.ops and ts[0].device.type != "cpu"):
            return torch.stack([self.raw(t) for t in ts]) if ts else None
        cols = {}
        if "norm" in self.ops:
            cols["norm"] = torch.stack(torch._foreach_norm(ts))
        if "max" in self.ops:
            cols["max"] = torch.stack(torch._foreach_max(ts))
        if "min" in self.ops:
            cols["min"] = torch.stack([t.amin() for t in ts])
        if "mean" in self.ops:
            cols["mean"] = torch.stack([t.sum(dtype=torch.float32) for t in ts])
        if "zeros" in self.ops:
            cols["zeros"] = torch.stack([self._zeros_count(t) for t in ts])
        if "nans" in self.ops:
            probe = cols.get(self._nan_probe) if self._nan_probe else None
            if probe is not None and bool(torch.isfinite(probe).all()):
                cols["nans"] = torch.zeros(len(ts))
            else:
                cols["nans"] = torch.stack([torch.count_nonzero(torch.isnan(t)) for t in ts])
        return torch.stack([cols[op].to(torch.float32) for op in self.ops], dim=1)


class StatsBatch:
    """The pending rows of one step: descriptions plus on-device raw op vectors, resolved at step end."""

    def __init__(self, stats):
        self.stats = stats
        self._meta = []     # (tag, name, micro_step, shape, dtype, vpp_stage) per row
        self._values = []   # raw vector (one row) or matrix (len(names) rows), same order as _meta

    def __len__(self):
        return len(self._meta)

    def add(self, tag, name, micro_step, tensor, vector, vpp_stage=0):
        self._meta.append((tag, name, micro_step, tuple(tensor.shape), str(tensor.dtype), vpp_stage))
        self._values.append(vector.unsqueeze(0))

    def add_many(self, tag, names, tensors, matrix, vpp_stages):
        for name, t, vpp in zip(names, tensors, vpp_stages):
            self._meta.append((tag, name, None, tuple(t.shape), str(t.dtype), vpp))
        self._values.append(matrix)

    def resolve(self, step):
        """Move every vector to the host (one transfer per device) and return `MetricRow`s in order."""
        if not self._meta:
            return []
        by_device = {}
        for i, v in enumerate(self._values):
            by_device.setdefault(v.device, []).append(i)
        host = [None] * len(self._values)
        for idxs in by_device.values():
            flat = torch.cat([self._values[i] for i in idxs]).tolist()
            pos = 0
            for i in idxs:
                n = self._values[i].shape[0]
                host[i] = flat[pos:pos + n]
                pos += n
        values = [row for block in host for row in block]
        rows = [MetricRow(tag, name, step, micro, self.stats.finish(vals, math.prod(shape)), shape, dtype, vpp)
                for (tag, name, micro, shape, dtype, vpp), vals in zip(self._meta, values)]
        self._meta, self._values = [], []
        return rows

"""Element-wise error metrics of a target tensor against a golden one, in float64 chunks.

Shared by `msprobe compare` (tensor mode) and `msprobe acc_check`. The definitions follow msProbe's
(msprobe-facts.md §8.4): inf/nan must sit at the same positions on both sides and are then zeroed;
golden zeros get a tiny epsilon on both sides of the relative error. Metrics are accumulated chunk by
chunk so a memory-mapped multi-GB tensor never needs a float64 copy of itself. Chunks are small enough
to stay in the CPU cache between the passes over them; guarded by `benchmarks/compare_throughput.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

CHUNK_ELEMENTS = 1 << 16  # 512 KiB per float64 buffer: the passes over a chunk hit the cache
REL_EPS = float(np.finfo(np.float32).eps)


@dataclass
class TensorMetrics:
    cosine: float
    euc_dist: float
    max_abs_err: float
    max_rel_err: float
    one_thousandth: float  # fraction of elements with relative error < 0.001
    five_thousandths: float  # fraction with relative error < 0.005
    message: str = ""
    nonfinite_moved: bool = False  # both hold inf/nan, not at the same elements

    def as_dict(self) -> dict:
        return {
            "Cosine": self.cosine,
            "EucDist": self.euc_dist,
            "MaxAbsErr": self.max_abs_err,
            "MaxRelativeErr": self.max_rel_err,
            "One Thousandth Err Ratio": self.one_thousandth,
            "Five Thousandths Err Ratio": self.five_thousandths,
        }


NAN_METRICS = dict(cosine=math.nan, euc_dist=math.nan, max_abs_err=math.nan, max_rel_err=math.nan,
                   one_thousandth=math.nan, five_thousandths=math.nan)


def _dot(a, b):
    # einsum's own loop, not BLAS: OpenBLAS's threads spin on dots this small for far more than the work
    return float(np.einsum("i,i->", a, b))


@dataclass
class MetricAccumulator:
    """Running sums over aligned chunks of target and golden; `result()` gives TensorMetrics."""

    n: int = 0
    dot: float = 0.0
    tt: float = 0.0
    gg: float = 0.0
    sq_diff: float = 0.0
    max_abs: float = 0.0
    max_rel: float = 0.0
    below_1e3: int = 0
    below_5e3: int = 0
    nonfinite_mismatch: int = 0
    messages: list = field(default_factory=list)

    def _buffers(self, n):
        bufs = getattr(self, "_bufs", None)
        if bufs is None or bufs[0].size < n:
            bufs = tuple(np.empty(max(n, CHUNK_ELEMENTS)) for _ in range(3))
            self._bufs = bufs
        return tuple(b[:n] for b in bufs)

    def update(self, target, golden) -> None:
        target = np.asarray(target).reshape(-1)
        golden = np.asarray(golden).reshape(-1)
        if target.size != golden.size:
            raise ValueError(f"chunk sizes differ: {target.size} vs {golden.size}")
        if target.size == 0:
            return
        t, g, d = self._buffers(target.size)
        np.copyto(t, target, casting="unsafe")  # float64 working copies; the inputs are never written
        np.copyto(g, golden, casting="unsafe")
        tt, gg = _dot(t, t), _dot(g, g)
        if not (math.isfinite(tt) and math.isfinite(gg)):
            self._zero_nonfinite(t, g)
            tt, gg = _dot(t, t), _dot(g, g)
        self.n += t.size
        self.dot += _dot(t, g)
        self.tt += tt
        self.gg += gg
        np.subtract(t, g, out=d)
        self.sq_diff += _dot(d, d)
        np.abs(d, out=d)
        self.max_abs = max(self.max_abs, float(d.max()))
        ag = np.abs(g, out=g)
        if ag.min() == 0.0:  # golden zeros: divide by a tiny epsilon instead
            ag[ag == 0.0] = REL_EPS
        rel = np.divide(d, ag, out=t)
        self.max_rel = max(self.max_rel, float(rel.max()))
        self.below_1e3 += int(np.count_nonzero(rel < 0.001))
        self.below_5e3 += int(np.count_nonzero(rel < 0.005))

    def _zero_nonfinite(self, t, g):
        """inf/nan must coincide exactly (same value class); then they are left out of the numbers."""
        t_bad = ~np.isfinite(t)
        g_bad = ~np.isfinite(g)
        same = (t_bad == g_bad) & ((t == g) | (np.isnan(t) & np.isnan(g)) | ~t_bad)
        self.nonfinite_mismatch += int(t_bad.size - np.count_nonzero(same))
        both = t_bad | g_bad
        t[both] = 0.0
        g[both] = 0.0

    def result(self) -> TensorMetrics:
        if self.n == 0:
            return TensorMetrics(**NAN_METRICS, message="empty tensor")
        messages = []
        if self.nonfinite_mismatch:
            return TensorMetrics(**NAN_METRICS, nonfinite_moved=True, message=(
                f"inf/nan at different positions in {self.nonfinite_mismatch} of {self.n} elements"))
        cosine = _cosine(self.dot, self.tt, self.gg, messages)
        if self.n == 1:
            cosine = math.nan
            messages.append("cosine is undefined for a single element")
        return TensorMetrics(
            cosine=cosine,
            euc_dist=math.sqrt(self.sq_diff),
            max_abs_err=self.max_abs,
            max_rel_err=self.max_rel,
            one_thousandth=self.below_1e3 / self.n,
            five_thousandths=self.below_5e3 / self.n,
            message="; ".join(messages),
        )


def _cosine(dot: float, tt: float, gg: float, messages: list) -> float:
    if tt == 0.0 and gg == 0.0:
        return 1.0
    if tt == 0.0 or gg == 0.0:
        messages.append(("target" if tt == 0.0 else "golden") + " is all zeros: cosine undefined")
        return math.nan
    cos = dot / (math.sqrt(tt) * math.sqrt(gg))
    cos = min(1.0, max(-1.0, cos))
    return round(cos, 6) if cos > 0.9999 else cos


def tensor_metrics(target, golden, chunk: int = CHUNK_ELEMENTS) -> TensorMetrics:
    """Metrics of two same-shaped arrays (any dtype numpy can cast to float64, memmaps included)."""
    t = np.asarray(target)
    g = np.asarray(golden)
    if t.shape != g.shape:
        return TensorMetrics(**NAN_METRICS, message=f"shape differs: {t.shape} vs {g.shape}")
    t = t.reshape(-1)
    g = g.reshape(-1)
    acc = MetricAccumulator()
    for start in range(0, t.size, chunk):
        acc.update(t[start:start + chunk], g[start:start + chunk])
    return acc.result()

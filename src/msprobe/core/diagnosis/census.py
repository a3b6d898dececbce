"""The working precision of a run: the dtype pairs of its matched float tensors, counted pair by pair.

Must not import torch or mindspore.
"""
from __future__ import annotations

from msprobe.core.diagnosis.calls import dtype_census, implicit_lowering, working_precision
from msprobe.core.diagnosis.thresholds import UNIT_ROUNDOFF, WORKING_PRECISION_SHARE


class PrecisionCensus:
    """The dtype pairs of the matched float tensors seen so far: what decides the working precision,
    gathered one compare pair at a time (a many-rank compare keeps one pair's rows at once)."""

    def __init__(self):
        self.counts, self.total, self.lowered = {}, 0, set()

    def add(self, result):
        self._count(*dtype_census(result))
        self.lowered |= implicit_lowering(result)

    def merge(self, other):
        self._count(other.counts, other.total)
        self.lowered |= getattr(other, "lowered", set())

    def _count(self, counts, total):
        for dtype, k in counts.items():
            self.counts[dtype] = self.counts.get(dtype, 0) + k
        self.total += total

    def decide(self, precision=None):
        """(dtype, unit roundoff): `precision` when given (checked), else the census' working precision."""
        if precision is None:
            return working_precision(self.counts, self.total, WORKING_PRECISION_SHARE, self.lowered)
        from msprobe.core.compare.dtypes import canonical_dtype
        from msprobe.core.errors import ConfigError
        name = canonical_dtype(precision)
        if name not in UNIT_ROUNDOFF:
            raise ConfigError("precision", precision, ", ".join(UNIT_ROUNDOFF))
        return name, UNIT_ROUNDOFF[name]

"""overflow_check dump task, for both adapters: the run's budget of overflowing records, the verdict
on a finished record from its statistics, and the gate that keeps only the overflowing records.

A value overflows when it holds inf or nan, or, for float16/bfloat16 (whose hardware may saturate
instead of producing inf), when it reaches the dtype's largest finite magnitude. The verdict reads the
record's Max/Min, which on an accelerator reach the host only at a resolve: so every record passes the
session's queue and, once its statistics are in, the OverflowGate (core/dump/capture.py), in call
order; a kept record gets its tensor files then. Nothing is written for a step without an overflow.
"""

import logging
import math

from msprobe.core.dump.reader import iter_tensor_records, stat_value

logger = logging.getLogger(__name__)

FLOAT16_MAX = 65504.0
BFLOAT16_MAX = 3.3895313892515355e38


class OverflowBudget:
    """Counts overflowing records over a whole run; `overflow_nums` -1 means no limit."""

    def __init__(self, limit):
        self.limit = limit
        self.count = 0

    @property
    def exhausted(self):
        return self.limit != -1 and self.count >= self.limit

    def take(self, key):
        """Account for one overflowing record; False once the limit was reached before it."""
        if self.exhausted:
            return False
        self.count += 1
        logger.warning("msprobe overflow_check: %s overflowed (%d of %s)", key, self.count,
                       "unlimited" if self.limit == -1 else self.limit)
        if self.exhausted:
            logger.warning("msprobe overflow_check: overflow_nums=%d reached; nothing more is recorded",
                           self.limit)
        return True


def record_overflows(value, saturating):
    """Does any tensor record in `value` (nested lists/dicts of records) show an overflow in Max/Min?

    `saturating` maps the records' dtype names to their largest finite magnitude (e.g. "Float16": 65504).
    """
    for _, rec in iter_tensor_records(value):
        limit = saturating.get(rec.get("dtype"))
        for field in ("Max", "Min"):
            v = stat_value(rec.get(field))
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            if not math.isfinite(v) or (limit is not None and abs(v) >= limit):
                return True
    return False


class OverflowGate:
    """Holds a session's finished records until their statistics are on the host, then keeps the
    overflowing ones, in call order, until the budget is spent.

    Args:
        budget: the run's OverflowBudget (shared by every step and session).
        saturating: the records' dtype names -> largest finite magnitude (see record_overflows).
    """

    def __init__(self, budget, saturating):
        self.budget = budget
        self.saturating = saturating
        self._files = {}  # id(tensor record) -> (tensor record, value, file stem)

    @property
    def exhausted(self):
        return self.budget.exhausted

    def note_tensor(self, rec, value, file_stem):
        """`rec` needs a tensor file of `value` (a host array or a tensor) if its record is kept."""
        self._files[id(rec)] = (rec, value, file_stem)

    def decide(self, key, record, check):
        """(keep, files): whether the finished `record` is written — `check` (default: the record)
        overflows and the budget allows — and the tensor files its records asked for."""
        files = [self._files.pop(id(rec)) for _, rec in iter_tensor_records(record) if id(rec) in self._files]
        keep = (not self.budget.exhausted and record_overflows(record if check is None else check, self.saturating)
                and self.budget.take(key))
        return keep, files

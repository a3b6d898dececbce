"""overflow_check dump task, framework-neutral part: the run's budget of overflowing records and the
verdict on a finished record from its statistics.

A value overflows when it holds inf or nan, or, for float16/bfloat16 (whose hardware may saturate
instead of producing inf), when it reaches the dtype's largest finite magnitude.
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

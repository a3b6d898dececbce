"""overflow_check task for MindSpore: keep only the records whose outputs overflowed.

A value overflows when it holds inf or nan, or — for float16/bfloat16, whose hardware may saturate
instead of producing inf — when it reaches the dtype's largest finite magnitude (|x| == finfo.max).

Records are summarised in batches (session.deferred_record: reading a MindSpore tensor spins the
PyNative pipeline), so the decision cannot be taken when a call returns. The session hands every
finished record to an OverflowGate instead of the writer; after each batch the gate looks, in call
order, at the records whose statistics are in, and passes on to the writer (with their tensor files,
stack and construct entries) only those whose Max/Min show an overflow, until `overflow_nums` is
reached. Nothing is written (no directory either) for a step without an overflow.
"""

import logging
from collections import deque

from msprobe.core.dump.overflow import BFLOAT16_MAX, FLOAT16_MAX
from msprobe.core.dump.overflow import record_overflows as core_record_overflows
from msprobe.core.dump.reader import iter_tensor_records

logger = logging.getLogger(__name__)

# largest finite magnitudes, keyed by the dtype names the records carry
_SATURATING = {"Float16": FLOAT16_MAX, "BFloat16": BFLOAT16_MAX}


def record_overflows(value):
    """Does any tensor record in `value` (nested lists/dicts of records) show an overflow in Max/Min?"""
    return core_record_overflows(value, _SATURATING)


class OverflowGate:
    """Holds a session's finished records until their statistics are in, then keeps the overflowing ones.

    Args:
        budget: the run's OverflowBudget (shared by every step and session).
    """

    def __init__(self, budget):
        self.budget = budget
        self._queue = deque()  # [key, record, checked value, waits, actions on keep]
        self._by_key = {}  # key -> its queue entry (for structure noted after the record)
        self._files = {}  # id(tensor record) -> (tensor record, host array or tensor, file stem)

    def note_tensor(self, rec, value, file_stem):
        """`rec` may need a tensor file of `value` (a numpy copy or a tensor) if its record is kept."""
        self._files[id(rec)] = (rec, value, file_stem)

    def offer(self, key, record, check, waits):
        entry = [key, record, check, list(waits), []]
        self._queue.append(entry)
        self._by_key[key] = entry

    def on_keep(self, key, action):
        """Run `action()` (stack/construct entries) if the record `key` is kept; dropped otherwise."""
        entry = self._by_key.get(key)
        if entry is not None:
            entry[4].append(action)

    def settle(self, keep):
        """Decide, in call order, on the records whose statistics are all in; `keep(key, record, files)`
        writes one. A record still waiting for its statistics holds back the ones after it."""
        while self._queue and all(f.done() for f in self._queue[0][3]):
            key, record, check, _, actions = self._queue.popleft()
            if self._by_key.get(key) is not None and self._by_key[key][1] is record:
                del self._by_key[key]
            files = [self._files.pop(id(rec)) for _, rec in iter_tensor_records(record) if id(rec) in self._files]
            if not self.budget.exhausted and record_overflows(check) and self.budget.take(key):
                keep(key, record, files)
                for action in actions:
                    action()

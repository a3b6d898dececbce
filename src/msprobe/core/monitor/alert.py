"""Alert rules over the monitor's rows, and the anomaly records they produce.

- `AnomalyTurbulence(threshold)`: a value's magnitude exceeds (1 + threshold) times the largest magnitude
  of the same series (same tag, name, micro step, op) over its last `TURBULENCE_WINDOW` recorded steps,
  once it has `TURBULENCE_MIN_HISTORY` of them: a change against the series' own recent history, so a
  quantity that grows steadily (Adam's moments filling up, a zero-initialised bias moving away from
  zero) or swings within its usual range stays quiet. It judges the magnitude ops: `norm`, and of `min`
  and `max` the one farther from zero (the other is the low end of the tensor's range: the minimum of
  `exp_avg_sq` or of a ReLU output). Not judged: integer and bool tensors (token ids), exactly-zero
  values (they are not history either, so a zero baseline never fires) and values near zero, whose
  per-element size is below `NEAR_ZERO_FRACTION` of the largest of their data type at that step. A
  `mean` of zero-centred tensors swings around 0, so its relative change says nothing, and the counting
  ops (`nans`, `zeros`) are left to `AnomalyNan`.
- `AnomalyNan(threshold)`: a value is NaN, or its magnitude exceeds `threshold`; for the `nans` op, any
  count above 0.

Records carry msProbe's fields (rank, step, micro_step, pp_stage, vpp_stage, call_id, tag_name,
message, group_mates) plus rule, op, value and recent_max. Must not import torch or mindspore.
"""

import json
import logging
import math
import os

import numpy as np

from msprobe.core.dump.json_append import JsonAppendFile
from msprobe.core.monitor.alert_thresholds import NEAR_ZERO_FRACTION, TURBULENCE_MIN_HISTORY, TURBULENCE_WINDOW

logger = logging.getLogger(__name__)

_TURBULENCE_OPS = ("norm", "min", "max")


def _is_integer(dtype):
    """torch.int64, Int32, torch.bool, UInt8, ...: no rounding, no turbulence (token ids, masks)."""
    text = str(dtype).lower()
    return "int" in text or "bool" in text


def _numel(shape):
    n = 1
    for s in shape or ():
        n *= int(s)
    return n


class AnomalyDetector:
    """Applies the configured rules to each step's rows and keeps each series' recent values.

    The checks of a step run as numpy array operations over all rows and ops at once; only the hits
    become Python records.

    Args:
        rules: `AlertRule`s from the config.
        ops: op names, in the order of each row's values.
        rank: written into every record.
    """

    def __init__(self, rules, ops, rank):
        self.rules = list(rules)
        self.ops = tuple(ops)
        self.rank = rank
        self._index = {}                                                    # series (tb tag) -> history row
        self._recent = np.zeros((0, len(self.ops), TURBULENCE_WINDOW))     # last non-zero magnitudes; 0 = none
        self._written = np.zeros((0, len(self.ops)), dtype=np.int64)       # how many were ever stored

    def _rows_of(self, tags):
        idx = np.empty(len(tags), dtype=np.int64)
        for i, tag in enumerate(tags):
            j = self._index.get(tag)
            if j is None:
                j = self._index[tag] = len(self._index)
            idx[i] = j
        grow = len(self._index) - self._recent.shape[0]
        if grow > 0:
            self._recent = np.concatenate([self._recent, np.zeros((grow,) + self._recent.shape[1:])])
            self._written = np.concatenate([self._written, np.zeros((grow, len(self.ops)), dtype=np.int64)])
        return idx

    def check_step(self, rows):
        """Return the anomaly records of one step's rows, then add the rows to the history."""
        if not self.rules or not rows:
            return []
        tags = [row.tb_tag(self.rank) for row in rows]
        idx = self._rows_of(tags)
        values = np.array([row.values for row in rows], dtype=np.float64)
        magnitude = np.abs(values)
        recent = self._recent[idx]
        peak = recent.max(axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            hit_rule = np.full(values.shape, -1)
            for r, rule in reversed(list(enumerate(self.rules))):   # the first matching rule wins
                if rule.name == "AnomalyNan":
                    hit = np.isnan(values) | (magnitude > rule.threshold)
                    for j, op in enumerate(self.ops):
                        if op == "nans":
                            hit[:, j] = values[:, j] > 0
                        elif op == "zeros":
                            hit[:, j] = False
                else:
                    judged = self._judged(rows, magnitude) & ((recent > 0).sum(axis=2) >= TURBULENCE_MIN_HISTORY)
                    hit = judged & (magnitude > (1.0 + rule.threshold) * peak)
                hit_rule[hit] = r
        found = [self._record(self.rules[hit_rule[i, j]], rows[i], i, tags[i], self.ops[j], float(values[i, j]),
                              float(peak[i, j]) if peak[i, j] > 0 else None)
                 for i, j in zip(*(a.tolist() for a in np.nonzero(hit_rule >= 0)))]
        self._remember(idx, magnitude)
        return found

    def _judged(self, rows, magnitude):
        """Which (row, op) AnomalyTurbulence looks at: see the module docstring."""
        ops = self.ops
        judged = np.zeros(magnitude.shape, dtype=bool)
        for j, op in enumerate(ops):
            judged[:, j] = op in _TURBULENCE_OPS
        judged &= np.array([not _is_integer(row.dtype) for row in rows])[:, None]
        if "min" in ops and "max" in ops:
            lo, hi = ops.index("min"), ops.index("max")
            judged[:, lo] &= magnitude[:, lo] >= magnitude[:, hi]
            judged[:, hi] &= magnitude[:, hi] >= magnitude[:, lo]
        size = magnitude.copy()                     # per-element size: a norm over sqrt(number of elements)
        if "norm" in ops:
            size[:, ops.index("norm")] /= np.sqrt([max(_numel(row.shape), 1) for row in rows])
        size = np.where(judged & np.isfinite(size), size, 0.0)
        kinds = {}
        kind = np.array([kinds.setdefault(row.tag, len(kinds)) for row in rows])
        largest = np.zeros(len(kinds))
        np.maximum.at(largest, kind, size.max(axis=1))
        return judged & (size >= NEAR_ZERO_FRACTION * largest[kind][:, None]) & (size > 0)

    def _remember(self, idx, magnitude):
        """Append each finite non-zero magnitude to its series' window (a ring of TURBULENCE_WINDOW)."""
        keep = np.isfinite(magnitude) & (magnitude > 0)
        rows, cols = np.nonzero(keep)
        series = idx[rows]
        slot = self._written[series, cols] % TURBULENCE_WINDOW
        self._recent[series, cols, slot] = magnitude[rows, cols]
        np.add.at(self._written, (series, cols), 1)

    def _record(self, rule, row, call_id, tag_name, op, value, recent_max):
        if rule.name == "AnomalyNan":
            why = f"value {value!r} is NaN or beyond {rule.threshold:g}" if op != "nans" else f"{value:g} NaN elements"
        else:
            why = (f"|value| {abs(value):.6g} > (1 + {rule.threshold:g}) x {recent_max:.6g}, the largest "
                   f"|value| of its last {TURBULENCE_WINDOW} recorded steps")
        return {
            "rank": self.rank, "step": row.step, "micro_step": row.micro_step or 0, "pp_stage": 0,
            "vpp_stage": row.vpp_stage, "call_id": call_id, "tag_name": tag_name,
            "message": f"{rule.name}: {row.tag} {row.name} {op} at step {row.step}: {why}",
            "group_mates": [self.rank], "rule": rule.name, "op": op,
            "value": value if math.isfinite(value) else str(value),
            "recent_max": recent_max,
        }


class AnomalyFile:
    """`anomaly_detected/anomaly_{rank}.json`: every anomaly of the run, keyed like msProbe; appended in
    place, so the file is valid JSON after each step and a step costs only its own records."""

    def __init__(self, output_root, rank):
        self.path = os.path.join(output_root, "anomaly_detected", f"anomaly_{rank}.json")
        self._file = None

    def add(self, anomalies):
        if not anomalies:
            return
        if self._file is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._file = JsonAppendFile(self.path)
        # one write per step: the first member goes through append_raw, the rest ride along in its value text
        members = [(json.dumps(f"{a['tag_name']}_{a['op']}_step_{a['step']}_call_{a['call_id']}"),
                    json.dumps(a, allow_nan=False)) for a in anomalies]
        rest = "".join(f",\n {k}: {v}" for k, v in members[1:])
        self._file.append_raw(members[0][0], members[0][1] + rest)

    def close(self):
        if self._file is not None:
            self._file.close()

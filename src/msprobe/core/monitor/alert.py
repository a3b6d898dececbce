"""Alert rules over the monitor's rows, and the anomaly records they produce.

- `AnomalyTurbulence(threshold)`: a value's magnitude exceeds (1 + threshold) times the magnitude of
  the mean of the same series (same tag, name, micro step, op) over the steps recorded before. It
  watches the magnitude ops `norm`, `min`, `max`: a `mean` of zero-centred tensors swings around 0,
  so its relative change says nothing (msProbe flags it and floods the anomaly file), and the
  counting ops (`nans`, `zeros`) are left to `AnomalyNan`.
- `AnomalyNan(threshold)`: a value is NaN, or its magnitude exceeds `threshold`; for the `nans` op, any
  count above 0.

Records carry msProbe's fields (rank, step, micro_step, pp_stage, vpp_stage, call_id, tag_name,
message, group_mates) plus rule, op, value and history_mean. Must not import torch or mindspore.
"""

import json
import logging
import math
import os

import numpy as np

from msprobe.core.dump.json_append import JsonAppendFile

logger = logging.getLogger(__name__)

_TURBULENCE_OPS = ("norm", "min", "max")


class AnomalyDetector:
    """Applies the configured rules to each step's rows and keeps each series' running mean.

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
        self._index = {}                               # series (tb tag) -> row of the history arrays
        self._sums = np.zeros((0, len(self.ops)))      # sum of the finite values of earlier steps
        self._counts = np.zeros((0, len(self.ops)))    # how many there were

    def _rows_of(self, tags):
        idx = np.empty(len(tags), dtype=np.int64)
        for i, tag in enumerate(tags):
            j = self._index.get(tag)
            if j is None:
                j = self._index[tag] = len(self._index)
            idx[i] = j
        grow = len(self._index) - self._sums.shape[0]
        if grow > 0:
            pad = np.zeros((grow, len(self.ops)))
            self._sums, self._counts = np.vstack([self._sums, pad]), np.vstack([self._counts, pad])
        return idx

    def check_step(self, rows):
        """Return the anomaly records of one step's rows, then add the rows to the history."""
        if not self.rules or not rows:
            return []
        tags = [row.tb_tag(self.rank) for row in rows]
        idx = self._rows_of(tags)
        values = np.array([row.values for row in rows], dtype=np.float64)
        counts = self._counts[idx]
        with np.errstate(invalid="ignore", divide="ignore"):
            hist = np.where(counts > 0, self._sums[idx] / np.maximum(counts, 1), np.nan)
            hit_rule = np.full(values.shape, -1)
            for r, rule in reversed(list(enumerate(self.rules))):   # the first matching rule wins
                if rule.name == "AnomalyNan":
                    hit = np.isnan(values) | (np.abs(values) > rule.threshold)
                    for j, op in enumerate(self.ops):
                        if op == "nans":
                            hit[:, j] = values[:, j] > 0
                        elif op == "zeros":
                            hit[:, j] = False
                else:
                    hit = np.abs(values) > (1.0 + rule.threshold) * np.abs(hist)   # False where hist is nan
                    for j, op in enumerate(self.ops):
                        if op not in _TURBULENCE_OPS:
                            hit[:, j] = False
                hit_rule[hit] = r
        found = [self._record(self.rules[hit_rule[i, j]], rows[i], i, tags[i], self.ops[j], float(values[i, j]),
                              None if np.isnan(hist[i, j]) else float(hist[i, j]))
                 for i, j in zip(*(a.tolist() for a in np.nonzero(hit_rule >= 0)))]
        finite = np.isfinite(values)
        np.add.at(self._sums, idx, np.where(finite, values, 0.0))
        np.add.at(self._counts, idx, finite)
        return found

    def _record(self, rule, row, call_id, tag_name, op, value, hist_mean):
        if rule.name == "AnomalyNan":
            why = f"value {value!r} is NaN or beyond {rule.threshold:g}" if op != "nans" else f"{value:g} NaN elements"
        else:
            why = (f"|value| {abs(value):.6g} > (1 + {rule.threshold:g}) x |mean of earlier steps| "
                   f"{abs(hist_mean):.6g}")
        return {
            "rank": self.rank, "step": row.step, "micro_step": row.micro_step or 0, "pp_stage": 0,
            "vpp_stage": row.vpp_stage, "call_id": call_id, "tag_name": tag_name,
            "message": f"{rule.name}: {row.tag} {row.name} {op} at step {row.step}: {why}",
            "group_mates": [self.rank], "rule": rule.name, "op": op,
            "value": value if math.isfinite(value) else str(value),
            "history_mean": hist_mean,
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

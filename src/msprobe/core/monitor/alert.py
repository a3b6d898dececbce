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

import logging
import math
import os

from msprobe.core.dump.json_append import JsonAppendFile

logger = logging.getLogger(__name__)

_TURBULENCE_OPS = ("norm", "min", "max")


def _turbulence(value, history_mean, threshold):
    if history_mean is None or math.isnan(value) or math.isnan(history_mean):
        return False
    return abs(value) > (1.0 + threshold) * abs(history_mean)


class AnomalyDetector:
    """Applies the configured rules to each step's rows and keeps each series' running mean.

    Args:
        rules: `AlertRule`s from the config.
        ops: op names, in the order of each row's values.
        rank: written into every record.
    """

    def __init__(self, rules, ops, rank):
        self.rules = list(rules)
        self.ops = tuple(ops)
        self.rank = rank
        self._history = {}  # (tb_tag, op) -> [sum, count] of the finite values seen at earlier steps

    def check_step(self, rows):
        """Return the anomaly records of one step's rows, then add the rows to the history."""
        found = []
        if not self.rules:
            return found
        updates = []
        for call_id, row in enumerate(rows):
            tag_name = row.tb_tag(self.rank)
            for op, value in zip(self.ops, row.values):
                key = (tag_name, op)
                hist = self._history.get(key)
                hist_mean = hist[0] / hist[1] if hist and hist[1] else None
                for rule in self.rules:
                    if rule.name == "AnomalyNan":
                        hit = (value > 0) if op == "nans" else (op != "zeros" and (
                            math.isnan(value) or abs(value) > rule.threshold))
                    elif op not in _TURBULENCE_OPS:
                        hit = False
                    else:
                        hit = _turbulence(value, hist_mean, rule.threshold)
                    if hit:
                        found.append(self._record(rule, row, call_id, tag_name, op, value, hist_mean))
                        break
                if math.isfinite(value):
                    updates.append((key, value))
        for key, value in updates:
            hist = self._history.setdefault(key, [0.0, 0])
            hist[0] += value
            hist[1] += 1
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
        for a in anomalies:
            self._file.append(f"{a['tag_name']}_{a['op']}_step_{a['step']}_call_{a['call_id']}", a)

    def close(self):
        if self._file is not None:
            self._file.close()

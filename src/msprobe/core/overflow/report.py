"""Write an OverflowAnalysis as msProbe's `anomaly_analyze_{timestamp}.json` and as console text."""

import json
import math
import os
import time

from msprobe.core.dump.reader import iter_tensor_records
from msprobe.core.safe_files import make_dirs, open_text

NO_ANOMALY = "Cannot find any anomaly node"


def _json_safe(value):
    """inf/nan as the strings "inf"/"-inf"/"nan" (bare tokens are not JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def write_analysis_json(analysis, out_dir):
    """Write `anomaly_analyze_{YYYYmmddHHMMSS}.json` into `out_dir` (created); returns its path."""
    make_dirs(out_dir)
    path = os.path.join(out_dir, f"anomaly_analyze_{time.strftime('%Y%m%d%H%M%S')}.json")
    with open_text(path) as f:
        json.dump(_json_safe(analysis.by_label()), f, indent=2, allow_nan=False)
    return path


def _stats_line(rec):
    if not isinstance(rec, dict) or "shape" not in rec:
        return repr(rec.get("value")) if isinstance(rec, dict) else repr(rec)
    stats = ", ".join(f"{k}={rec[k]}" for k in ("Max", "Min", "Mean", "Norm") if k in rec)
    return f"{rec.get('dtype')} {rec.get('shape')} {stats}"


def format_analysis(analysis, stack_lines=12):
    """Human-readable report: the culprit with its stack, then the other anomalies one line each."""
    culprit = analysis.culprit
    if culprit is None:
        return f"{NO_ANOMALY} ({analysis.scanned} rank directories checked)"
    how = {"origin": "inputs finite, output inf/nan",
           "inherited": "no node turns finite inputs into inf/nan; this is the first non-finite value"}
    lines = [f"First anomaly: {culprit.key}  (step {culprit.step}, {culprit.label}; {how[culprit.kind]})",
             f"  dump: {culprit.rank_dir}"]
    record = culprit.record if isinstance(culprit.record, dict) and "type" not in culprit.record \
        else {"output": [culprit.record]}
    for name, value in record.items():
        for path, rec in iter_tensor_records(value):
            lines.append(f"  {'.'.join([name, *map(str, path)])}: {_stats_line(rec)}")
    if len(culprit.construct) > 1:
        lines.append("  inside: " + " < ".join(culprit.construct[1:]))
    if culprit.stack:
        lines.append("  stack (innermost first):")
        lines.extend("    " + s.replace("\n", " ").strip() for s in culprit.stack[:stack_lines])
    for a in analysis.anomalies[1:]:
        if a.kind == "received":
            lines.append(f"Also: {a.label} {a.key} (step {a.step}) output inf/nan received from "
                         f"rank {', '.join(map(str, a.from_ranks))}")
        else:
            lines.append(f"Also: {a.label} {a.key} (step {a.step}) {a.kind}")
    return "\n".join(lines)

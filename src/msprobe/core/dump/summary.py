"""Short summary of a dump tree (used by `msprobe summary` and the demo). Must not import torch."""

import math
import os
from collections import Counter
from dataclasses import dataclass, field

from msprobe.core.dump.reader import DumpReader, find_rank_dirs, iter_tensor_records, stat_value
from msprobe.core.errors import DumpFormatError, none_readable, where
from msprobe.core.naming import BACKWARD, FORWARD, split_base, split_key


@dataclass
class RankSummary:
    path: str
    step: int
    rank: str
    task: str
    level: str
    framework: str
    records: int = 0
    forward: int = 0
    backward: int = 0
    by_prefix: Counter = field(default_factory=Counter)
    tensors: int = 0
    tensor_files: int = 0
    nonfinite: list = field(default_factory=list)  # keys with inf/nan statistics
    largest: list = field(default_factory=list)  # (norm, key)


def summarize_dump(path, skipped=None):
    """RankSummary for every rank directory under `path`.

    Args:
        skipped: a list to collect one line per rank directory that cannot be read, which is then left
            out; None raises on the first one.

    Raises:
        DumpFormatError: a rank directory cannot be read (without `skipped`), or none can.
    """
    out, errors = [], []
    for rd in find_rank_dirs(path):
        try:
            r = DumpReader(rd.path)
        except DumpFormatError as e:
            if skipped is None:
                raise
            skipped.append(f"{where(rd.step, rd.rank, rd.is_proc)}: skipped: {e}")
            errors.append(e)
            continue
        s = RankSummary(rd.path, rd.step, os.path.basename(rd.path), r.task, r.level, r.framework)
        for key, rec in r.items():
            s.records += 1
            direction = split_key(key)[1]
            s.forward += direction == FORWARD
            s.backward += direction == BACKWARD
            s.by_prefix[split_base(key)[0]] += 1
            worst = 0.0
            for _, t in iter_tensor_records(rec):
                s.tensors += 1
                s.tensor_files += bool(t.get("data_name"))
                vals = [stat_value(t.get(k)) for k in ("Max", "Min", "Norm")]
                if any(isinstance(v, float) and not math.isfinite(v) for v in vals):
                    s.nonfinite.append(key)
                    break
                norm = vals[2]
                if isinstance(norm, (int, float)):
                    worst = max(worst, float(norm))
            s.largest.append((worst, key))
        s.largest = sorted(s.largest, reverse=True)
        out.append(s)
    if errors and not out:
        raise DumpFormatError(none_readable(errors, skipped))
    return out


def format_summary(summaries, top=5):
    lines = []
    for s in summaries:
        prefixes = ", ".join(f"{p} {n}" for p, n in s.by_prefix.most_common())
        lines.append(f"step{s.step}/{s.rank}: task={s.task} level={s.level} framework={s.framework}")
        lines.append(f"  {s.records} records ({s.forward} forward, {s.backward} backward): {prefixes}")
        lines.append(f"  {s.tensors} tensors summarised, {s.tensor_files} saved to files")
        if s.nonfinite:
            lines.append(f"  inf/nan in {len(s.nonfinite)} records, first: {s.nonfinite[0]}")
        if top and s.largest:
            lines.append("  largest norms: " + "; ".join(f"{k} {n:.4g}" for n, k in s.largest[:top]))
    return "\n".join(lines)

"""Per-rank CSV files of the monitor: `{tag}_{first}-{last}.csv`, one block of rows appended per step.

Columns follow msProbe: `vpp_stage,name,step,[micro_step],<ops...>,shape,dtype`; a file covers
`step_count_per_record` steps. Must not import torch or mindspore.
"""

import csv
import os

from msprobe.core.monitor.records import MICRO_STEP_TAGS


def format_value(value, ndigits):
    """`ndigits` significant digits (`%g`: integers without a point, `nan`, `inf`, `-inf` as words pandas
    reads).

    msProbe rounds to `ndigits` decimal places, which writes Adam's exp_avg_sq (~1e-9) as 0.0;
    significant digits keep small values readable at the same width.
    """
    return "%.*g" % (ndigits, value)


def shape_text(shape):
    return "[" + ", ".join(str(d) for d in shape) + "]"


class MonitorCsvWriter:
    """Writes a step's rows, grouped by tag, into the rank directory.

    Args:
        rank_dir: the rank's output directory (created if missing).
        ops: op names, the value columns.
        ndigits: significant digits kept.
        start_step: first step of the first file window.
        steps_per_file: steps per file (`step_count_per_record`).
    """

    def __init__(self, rank_dir, ops, ndigits=6, start_step=0, steps_per_file=1):
        self.rank_dir = rank_dir
        self.ops = tuple(ops)
        self.ndigits = ndigits
        self.start_step = start_step
        self.steps_per_file = steps_per_file
        os.makedirs(rank_dir, exist_ok=True)

    def path_for(self, tag, step):
        first = step - (step - self.start_step) % self.steps_per_file if step >= self.start_step else step
        last = first + self.steps_per_file - 1
        return os.path.join(self.rank_dir, f"{tag}_{first}-{last}.csv")

    def header(self, tag):
        micro = ["micro_step"] if tag in MICRO_STEP_TAGS else []
        return ["vpp_stage", "name", "step"] + micro + list(self.ops) + ["shape", "dtype"]

    def write_step(self, rows):
        by_tag = {}
        for row in rows:
            by_tag.setdefault(row.tag, []).append(row)
        for tag, tag_rows in by_tag.items():
            path = self.path_for(tag, tag_rows[0].step)
            new = not os.path.exists(path)
            with open(path, "a", newline="", encoding="utf-8") as f:
                writer = csv.writer(f)
                if new:
                    writer.writerow(self.header(tag))
                micro = tag in MICRO_STEP_TAGS
                nd = max(self.ndigits, 1)
                writer.writerows([r.vpp_stage, r.name, r.step] + ([r.micro_step] if micro else [])
                                 + ["%.*g" % (nd, v) for v in r.values] + [shape_text(r.shape), r.dtype]
                                 for r in tag_rows)

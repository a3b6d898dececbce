"""Where a step's rows go: the rank's output directory, its CSV or TensorBoard writer, the alert rules
and the anomaly file. Adapters hand over host-side rows once per step. Must not import torch or mindspore.

Layout (msProbe's): `$MONITOR_OUTPUT_DIR` (default `./monitor_output`) /
`{Mon}{DD}_{HH-MM-SS}-rank{r}-{id}/` with `{tag}_{a}-{b}.csv` or `events.out.tfevents.*`, and
`anomaly_detected/anomaly_{r}.json` next to the rank directories.
"""

import logging
import os
import time
import uuid

from msprobe.core.monitor.alert import AnomalyDetector, AnomalyFile
from msprobe.core.monitor.csv_writer import MonitorCsvWriter

logger = logging.getLogger(__name__)

OUTPUT_ENV = "MONITOR_OUTPUT_DIR"
DEFAULT_OUTPUT = "./monitor_output"


def output_root():
    return os.environ.get(OUTPUT_ENV) or DEFAULT_OUTPUT


def new_rank_dir(root, rank):
    stamp = time.strftime("%b%d_%H-%M-%S")
    return os.path.join(root, f"{stamp}-rank{rank}-{uuid.uuid4().hex[:8]}")


class StepRecorder:
    """Writes rows of each recorded step and raises the configured alerts.

    Args:
        config: `MonitorConfig`.
        rank: this process's rank (0 without a process group).
        root: output root; defaults to `$MONITOR_OUTPUT_DIR` or `./monitor_output`.

    Attributes:
        last_rows: {tag: [MetricRow]} of the latest step (what `format: "api"` hands back).
        anomalies: every anomaly record of the run, in order.
    """

    def __init__(self, config, rank, root=None):
        self.config = config
        self.rank = rank
        self.root = root or output_root()
        self.rank_dir = new_rank_dir(self.root, rank)
        self.writer = None
        if config.format == "csv":
            self.writer = MonitorCsvWriter(self.rank_dir, config.ops, config.ndigits, config.start_step,
                                           config.step_count_per_record)
        elif config.format == "tensorboard":
            from msprobe.core.monitor.tb_writer import MonitorTensorBoardWriter
            os.makedirs(self.rank_dir, exist_ok=True)
            self.writer = MonitorTensorBoardWriter(self.rank_dir, rank, config.ops)
        self.detector = AnomalyDetector(config.alert_rules, config.ops, rank)
        self.anomaly_file = AnomalyFile(self.root, rank) if config.alert_dump else None
        self.last_rows = {}
        self.anomalies = []

    def write_step(self, rows):
        self.last_rows = {}
        for row in rows:
            self.last_rows.setdefault(row.tag, []).append(row)
        if self.writer is not None:
            self.writer.write_step(rows)
        found = self.detector.check_step(rows)
        if found:
            self.anomalies.extend(found)
            logger.warning("monitor rank %d step %d: %d anomalies, first: %s", self.rank, rows[0].step,
                           len(found), found[0]["message"])
            if self.anomaly_file is not None:
                self.anomaly_file.add(found)
        return found

    def flush(self):
        if self.writer is not None and hasattr(self.writer, "flush"):
            self.writer.flush()

    def close(self):
        if self.writer is not None and hasattr(self.writer, "close"):
            self.writer.close()
        if self.anomaly_file is not None:
            self.anomaly_file.close()

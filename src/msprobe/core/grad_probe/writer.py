"""GradProbeWriter: turns one optimizer step's reduced gradients into grad_summary_{S}.csv and bitmaps.

Adapters hand over a `resolve()` callable that returns plain numbers; it runs on the writer thread, so a
device-to-host copy waits there and not in the training loop. At most `max_pending` steps are queued,
which bounds the memory held by step results not yet written. Must not import torch or mindspore.
"""

import logging
import math
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from msprobe.core.grad_probe.files import direction_path, summary_header, summary_path, write_direction, \
    write_summary

logger = logging.getLogger(__name__)


@dataclass
class StepResult:
    """What `resolve()` returns for one step, one entry per parameter in the submitted order.

    Attributes:
        stats: (max, min, norm) per parameter.
        md5: hex checksum per parameter (L0), else None.
        dist: shares of the L2 intervals then of zeros, per parameter (L2), else None.
        bits: packed sign bitmap (np.uint8) per parameter (L1, L2), else None.
    """

    stats: List[tuple]
    md5: Optional[List[str]] = None
    dist: Optional[List[list]] = None
    bits: Optional[list] = None


def _num(v):
    """Shortest text that reads back as the same value (float32 stays short: 0.05, not 0.0500000007)."""
    if not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return str(v) if isinstance(v, np.floating) else repr(float(v))


class GradProbeWriter:
    """Writes a grad_probe output tree on one background thread.

    Args:
        cfg: GradProbeConfig.
        max_pending: steps queued before `submit` waits for the oldest.
    """

    def __init__(self, cfg, max_pending=4):
        self.cfg = cfg
        self.header = summary_header(cfg.grad_level, cfg.bounds)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="msprobe-grad-probe")
        self._pending = deque()
        self._max_pending = max_pending
        self.failures = 0

    def submit(self, rank, step, params, resolve):
        """Queue one step. `params`: [(name, shape)], `resolve`: () -> StepResult."""
        while len(self._pending) >= self._max_pending:
            self._wait(self._pending.popleft())
        self._pending.append(self._pool.submit(self._write, rank, step, params, resolve))

    def _wait(self, fut):
        try:
            fut.result()
        except Exception:  # never stop training for a monitor file; say so once per step
            self.failures += 1
            logger.exception("msprobe grad_probe: writing a step failed")

    def _write(self, rank, step, params, resolve):
        res = resolve()
        rows = []
        if res.bits is not None:
            os.makedirs(os.path.dirname(direction_path(self.cfg.dump_path, rank, step, "x")), exist_ok=True)
        for i, (name, shape) in enumerate(params):
            row = [name]
            if res.md5 is not None:
                row.append(res.md5[i])
            if res.dist is not None:
                row.extend(_num(v) for v in res.dist[i])
            row.extend(_num(v) for v in res.stats[i])
            row.append(str(list(shape)))
            rows.append(row)
            if res.bits is not None:
                write_direction(direction_path(self.cfg.dump_path, rank, step, name), res.bits[i])
        write_summary(summary_path(self.cfg.dump_path, rank, step), self.header, rows)

    def flush(self):
        while self._pending:
            self._wait(self._pending.popleft())

    def close(self):
        self.flush()
        self._pool.shutdown(wait=True)
        if self.failures:
            logger.error("msprobe grad_probe: %d step(s) could not be written to %s", self.failures,
                         self.cfg.dump_path)

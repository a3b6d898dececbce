"""A batch of device slots brought to the host in one non-blocking copy per buffer, then turned into
record fields: Mean and Norm of non-float64 data rounded to float32 (as the host kernel reports them), NaN
in Max/Min when a NaN is in the tensor, the checksum finished into CRC-32's 8 hex digits. The statistics
rows, and the records waiting for them, are filled by msprobe._record where it is built (a few hundred rows
a step: the Python loop was a quarter of the device path's resolve), else in numpy and Python here."""

import math

import numpy as np
import torch

from msprobe.core import checksum
from msprobe.core.dump.json_append import json_float
from msprobe.pytorch.summary.slots import CHECKSUM, STATS

try:
    from msprobe._record import fill_stats as _fill_stats_c, fill_waiting as _fill_waiting_c
except ImportError:  # not built: numpy and Python
    _fill_stats_c = _fill_waiting_c = None

_FLT_MAX = 3.4028234663852886e38
# readback.fill_stats' (and msprobe._record's) ways of reporting a dtype (record.c's FILL_* codes)
EXACT, LOW, INT, BOOL = range(4)


def start(buffers):
    """Queue the copy of `buffers` (their used rows) to the host."""
    copies = []
    for buf in buffers:
        rows = buf.rows[:buf.used]
        if rows.device.type == "cpu":
            copies.append((buf, rows, None))
            continue
        host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
        host.copy_(rows, non_blocking=True)
        event = torch.cuda.Event() if rows.device.type == "cuda" else None
        if event is not None:
            event.record()
        copies.append((buf, host, event))
    return Readback(copies)


class Readback:
    """A batch's slots on their way to the host."""

    __slots__ = ("copies",)

    def __init__(self, copies):
        self.copies = copies

    def finish(self):
        """Wait for the copies, set each slot's values and fill the records waiting for it."""
        for buf, host, event in self.copies:
            if event is not None:
                event.synchronize()
            elif host.device.type != "cpu":
                host = host.cpu()
            values = buf.fields  # each row's values into its dict, in place
            if buf.kind == STATS:
                if (_fill_stats_c is not None and host.dtype == torch.float64 and host.is_contiguous()
                        and host.shape[0] >= len(buf.ns)):
                    _fill_stats_c(values, buf.ns, buf.dtypes, CODES, host.data_ptr())
                else:
                    fill_stats(values, buf.ns, buf.dtypes, host.numpy())
            else:
                finish = checksum.finish_raw
                for rec, nbytes, raw in zip(values, buf.nbytes, host.numpy()[:, 0].tolist()):
                    rec["md5"] = finish(raw, nbytes)
            for i in buf.lost:  # (their rows were never written)
                values[i].update(_LOST[buf.kind])
            buf.values = values  # before the waiting records: a fill looks again after appending
            fills, buf.fills = buf.fills, []
            if _fill_waiting_c is not None:
                _fill_waiting_c(values, fills)
            else:
                for i, rec in fills:
                    rec.update(values[i])
            buf.rows = None  # the device memory goes; the values stay for records that reuse them
        self.copies = None


# the fields of a row whose tensor's memory was freed before it was read, by kind
_LOST = {STATS: {"Max": None, "Min": None, "Mean": None, "Norm": None}, CHECKSUM: {"md5": None}}

# how each dtype's row is reported: EXACT (float64), LOW (Mean and Norm in float32, as the host kernel reports
# them), INT (Max and Min as ints) or BOOL; one table for both fills
CODES = {d: BOOL if d == torch.bool else INT if not d.is_floating_point else EXACT if d == torch.float64 else LOW
         for d in (getattr(torch, name) for name in dir(torch)) if isinstance(d, torch.dtype)}


def stats_values_many(ns, dtypes, rows):
    """Record fields of many statistics rows (max, min, sum, sum of squares; row i of a tensor of ns[i]
    elements of dtypes[i]), one dict per row."""
    out = [{} for _ in ns]
    fill_stats(out, ns, dtypes, rows)
    return out


def fill_stats(fields, ns, dtypes, rows):
    """Record fields of many statistics rows into dicts `fields` (row i: a tensor of ns[i] elements of
    dtypes[i]; max, min, sum, sum of squares): the arithmetic in numpy, then four keys set a dict."""
    k = len(ns)
    if not k:
        return
    rows = rows[:k]
    n = np.asarray(ns, dtype=np.float64)
    with np.errstate(all="ignore"):
        mean = rows[:, 2] / n
        norm = np.sqrt(rows[:, 3])
        # float32 precision for non-float64 floats, as the host kernel reports them (within float32's range)
        codes = [CODES[d] for d in dtypes]
        low = np.fromiter((c == LOW for c in codes), dtype=bool, count=k)
        for col in (mean, norm):
            fits = low & (np.abs(col) <= _FLT_MAX)
            col[fits] = col[fits].astype(np.float32)
        finite = np.isfinite(rows).all(axis=1)
    for rec, code, (mx, mn, _, _), m, nm, ok in zip(fields, codes, rows.tolist(), mean.tolist(), norm.tolist(),
                                                    finite.tolist()):
        if code == BOOL:
            mx, mn, m, nm = bool(mx), bool(mn), None, None
        elif ok:
            if code == INT:
                mx, mn = int(mx), int(mn)
        else:
            if mx != mx or mn != mn:  # a NaN: torch's max and min say nan
                mx = mn = float("nan")
            elif code == INT and math.isfinite(mx) and math.isfinite(mn):
                mx, mn = int(mx), int(mn)
            mx, mn, m, nm = json_float(mx), json_float(mn), json_float(m), json_float(nm)
        rec["Max"] = mx
        rec["Min"] = mn
        rec["Mean"] = m
        rec["Norm"] = nm


def stats_values(row, n, dtype):
    """Record fields from one slot's row (max, min, sum, sum of squares)."""
    return stats_values_many([n], [dtype], np.asarray(row, dtype=np.float64).reshape(1, 4))[0]

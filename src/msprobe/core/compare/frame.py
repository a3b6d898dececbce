"""The typed row frame of one compare: target rows and their golden partners side by side.

Compare builds it once per (step, rank) pair; the result table (`table.py`), the diagnosis
(`core/diagnosis/`) and the graph read it. Values stay numbers and dtype names: text such as `"1.2%"` is
made only by the table and the writers. Golden columns are aligned to target rows on first use (NaN or
None where a target row has no partner): aligning the whole golden table costs seconds on a million rows.
Must not import torch or mindspore.
"""
from __future__ import annotations

import numpy as np

STAT_FIELDS = ("max", "min", "mean", "norm")
_DISPLAY_ONLY = ("name", "data_name", "fused")  # row columns nothing reads after the table
# tensor-mode metric arrays (float, NaN where not computed), one entry per target row
METRIC_FIELDS = ("cosine", "euc", "max_abs", "max_rel", "one_k", "five_k")


class AlignedGolden:
    """Golden columns aligned to target rows, each taken when first asked for."""

    def __init__(self, golden, gidx, matched):
        self._golden, self._gidx, self._matched, self._cols = golden, gidx, matched, {}

    def __getitem__(self, name):
        import pandas as pd
        if name not in self._cols:
            col = self._golden[name].to_numpy()
            if col.dtype.kind not in "fb":
                col = col.astype(object, copy=False)
            pad = {"f": np.nan, "b": False}.get(col.dtype.kind)
            if len(col):
                out = col[np.where(self._matched, self._gidx, 0)]
                out[~self._matched] = pad
            else:
                out = np.full(len(self._gidx), pad, dtype=col.dtype)
            self._cols[name] = pd.Series(out, dtype=out.dtype, copy=False)
        return self._cols[name]


def columns_frame(arrays):
    """DataFrame of numpy columns taken as they are (no copy): object columns stay object, where pandas
    would turn columns of strings into its own string dtype at a cost of seconds per million rows."""
    import pandas as pd
    # one DataFrame per run of object / other columns, in order: a Series per column costs more than
    # the rest of reading a small dump's rows
    runs = []
    for c, a in arrays.items():
        numbers = a.dtype.kind in "biufc"  # any other column is taken as object
        if not runs or runs[-1][0] != numbers:
            runs.append((numbers, {}))
        runs[-1][1][c] = a
    frames = [pd.DataFrame(cols, dtype=None if numbers else object, copy=False) for numbers, cols in runs]
    if not frames:
        return pd.DataFrame()
    return frames[0] if len(frames) == 1 else pd.concat(frames, axis=1)


def numeric(frame, field):
    """(float64 array, mask of entries that are numbers) of statistic `field` of a row table.

    The float column holds NaN both for absent values and for NaN statistics; only those rows are
    looked at again to tell the two apart.
    """
    f = frame["f" + field].to_numpy(dtype=np.float64)
    ok = ~np.isnan(f)
    nan_rows = np.flatnonzero(~ok)
    if len(nan_rows):
        raw = frame[field].to_numpy(dtype=object)[nan_rows]
        ok[nan_rows] = [isinstance(v, float) for v in raw]  # a NaN statistic, not a missing one
    return f, ok


class PairedRows:
    """One compare pair's rows, typed.

    Attributes:
        target: the target's row table (`rows.COLUMNS` + `rows.FLOAT_COLUMNS`), one row per tensor or
            argument in dump order.
        golden: golden columns aligned to `target` (`golden["dtype"]` ...).
        gidx: golden row index per target row, -1 where none pairs.
        matched: `gidx >= 0`.
        t_num, g_num: field -> (float array, is-a-number mask) of Max/Min/Mean/Norm.
        metrics: tensor mode: `METRIC_FIELDS` float arrays and `nonfinite_moved` (bool: both sides hold
            inf/nan, at different elements); None in other modes.
        verdicts: each row's verdict and messages (`verdict.Verdicts`), set by `table.build_table`;
            None for rows read back from a table.
    """

    def __init__(self, target, golden, gidx, metrics=None):
        self.target, self.gidx = target, gidx
        self.matched = gidx >= 0
        self.golden = AlignedGolden(golden, gidx, self.matched)
        self.golden_rows = golden
        self.t_num = {f: numeric(target, f) for f in STAT_FIELDS}
        self.g_num = {f: numeric(self.golden, f) for f in STAT_FIELDS}
        self.metrics = metrics
        self.verdicts = None

    def __len__(self):
        return len(self.target)

    def drop_display_columns(self):
        """Let go of what only the display table needed (names of golden rows, file names; the
        Parquet parts read requires_grad): a compare result keeps these rows for the diagnosis, and a
        million-row dump's columns weigh hundreds of megabytes."""
        self.target = self.target.drop(columns=[c for c in _DISPLAY_ONLY if c != "name"], errors="ignore")
        self.golden_rows = self.golden_rows.drop(columns=list(_DISPLAY_ONLY + ("suffix", "role")), errors="ignore")
        self.golden = AlignedGolden(self.golden_rows, self.gidx, self.matched)

    def stats(self, side):
        """(float array (n, 4) of Max, Min, Mean, Norm, presence mask (n, 4)) of "target" or "golden"."""
        num = self.t_num if side == "target" else self.g_num
        return (np.stack([num[f][0] for f in STAT_FIELDS], axis=1),
                np.stack([num[f][1] for f in STAT_FIELDS], axis=1))

    def metric(self, name):
        """A tensor-mode metric array (NaN everywhere in other modes)."""
        if self.metrics is None or name not in self.metrics:
            return np.full(len(self), np.nan)
        return np.asarray(self.metrics[name], dtype=np.float64)

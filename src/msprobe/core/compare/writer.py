"""Write a compare result table to csv (default) or xlsx with error/warning cells highlighted.

csv: None is written as `None`, infinities as ` inf`/` -inf` (a leading space keeps spreadsheet
programs from reading them as formulas). xlsx: openpyxl in write-only mode; from the rows' typed
verdicts and labels (`RowMarks`, never the cells' text), the Result cell and the cells behind each
message are filled red (error) or yellow (warning), and the Diagnosis cell red (introduces), yellow
(marginal) or orange (inherits). An xlsx is a zip whose entries and document
properties carry a time: both are the compare's timestamp (the one in the file names), so the same
compare writes the same bytes whichever engine ran it.

The csv is the text csv.writer (QUOTE_MINIMAL, `\r\n`) would write, built column by column and
joined row by row: pandas' to_csv writes the same bytes with twice the CPU, pyarrow's writer other
bytes (benchmarks/RESULTS.md, design notes; tests/core/compare/test_compare_speedups.py checks the text).
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import time
import zipfile
from dataclasses import dataclass

from msprobe.core.compare import columns as C
from msprobe.core.compare import verdict as V
from msprobe.core.compare.float_text import float_reprs
from msprobe.core.safe_files import make_dirs, open_text

log = logging.getLogger(__name__)
EXCEL_MAX_ROWS = 1_048_575  # one row of the sheet is the header
RED, YELLOW, ORANGE = "FFC7CE", "FFEB9C", "FCE4D6"
# the diagnosis' own column: where error enters (red), just past what is explained (yellow), carried in
DIAGNOSIS_FILLS = {"introduces": RED, "marginal": YELLOW, "inherits": ORANGE}

# message -> the columns that show why (highlighted with the Result cell)
_MESSAGE_COLUMNS = {
    V.MSG_DTYPE: ("NPU Dtype", "Bench Dtype"),
    V.MSG_SHAPE: ("NPU Tensor Shape", "Bench Tensor Shape"),
    V.MSG_REQUIRES_GRAD: ("NPU Requires_grad", "Bench Requires_grad", C.REQUIRES_GRAD_CONSISTENT),
    V.MSG_SCALAR: ("NPU max", "Bench max"),
    V.MSG_NONFINITE: ("NPU max", "NPU min"),
    V.MSG_MD5: ("NPU MD5", "BENCH MD5"),
    V.MSG_STATS_ERROR: ("NormRelativeErr",),
    V.MSG_STATS_WARNING: ("NormRelativeErr",),
    V.MSG_TENSOR_ERROR: ("One Thousandth Err Ratio",),
    V.MSG_TENSOR_WARNING: ("Cosine",),
}


@dataclass
class RowMarks:
    """What an xlsx highlights, typed: each row's verdict and messages (`verdict.Verdicts`, the table's
    Result and Err_message) and its Diagnosis label (`PairDiagnosis.labels`, or None without one)."""

    verdicts: object
    labels: object = None


def result_file_name(step=None, rank=None, is_proc=False, several_steps=False, single_file=False,
                     xlsx=False, timestamp=None, debug=False):
    """`compare_result_{ts}`, `compare_result_rank{r}_{ts}` or, for several steps,
    `compare_result_step{s}_rank{r}_{ts}` (msprobe-facts §8.5); `proc{pid}` for process-named dirs;
    `debug_compare_result_{rank|proc}_{ts}` for debug.json (single-point saves)."""
    ts = timestamp or time.strftime("%Y%m%d%H%M%S")
    if debug:
        return f"debug_compare_result_{'proc' if is_proc else 'rank'}{rank}_{ts}" + (".xlsx" if xlsx else ".csv")
    parts = ["compare_result"]
    if several_steps and step is not None:
        parts.append(f"step{step}")
    if not single_file and rank is not None:
        parts.append(f"{'proc' if is_proc else 'rank'}{rank}")
    parts.append(ts)
    return "_".join(parts) + (".xlsx" if xlsx else ".csv")


def _cell_text(v):
    if isinstance(v, float) and math.isinf(v):
        return " inf" if v > 0 else " -inf"
    if isinstance(v, str) and v in ("inf", "-inf"):
        return " " + v
    return v


_INF_VALUES = [math.inf, -math.inf, "inf", "-inf"]
_TEXT_COLUMNS = frozenset(C.COMMON + (C.RESULT, C.ERR_MESSAGE, C.STACK, C.DATA_NAME, C.DIAGNOSIS) + C.MD5)


def _float_cells(out, idx, values, text):
    """Render the floats `values` into `out[idx]`: NaN -> "nan"; infinities -> " inf"/" -inf" (kept as
    floats in text columns, where only NaN is rendered); finite values -> their repr."""
    import numpy as np
    finite = np.isfinite(values)
    if finite.all() and not text:
        out[idx] = float_reprs(values)
        return
    nan = np.isnan(values)
    out[idx[nan]] = "nan"
    if text:
        return
    out[idx[finite]] = float_reprs(values[finite])
    inf = ~finite & ~nan
    out[idx[inf]] = np.where(values[inf] > 0, " inf", " -inf").astype(object)


def _rendered_column(arr, text):
    """(cells, indices of the cells left as they are) of one column: None -> "None", NaN -> "nan",
    and outside the text columns floats -> repr and infinities (float or "inf" text) -> " inf"/" -inf".
    Values are grouped by type (one pass with `map(type)`), so a million-row column costs a few
    vectorised passes instead of a Python loop."""
    import numpy as np
    import pandas as pd
    n = len(arr)
    kinds = set(map(type, arr))
    out = arr.copy()
    if kinds == {str}:
        if not text:
            hit = np.flatnonzero((arr == "inf") | (arr == "-inf"))
            out[hit] = [" " + v for v in arr[hit]]
        return out, ()
    kinds = list(kinds)
    code_of = {kind: i for i, kind in enumerate(kinds)}
    codes = np.fromiter(map(code_of.__getitem__, map(type, arr)), dtype=np.int16, count=n)
    kept = []
    for code, kind in enumerate(kinds):
        idx = np.flatnonzero(codes == code)
        if kind is str:
            if not text:
                sub = arr[idx]
                hit = idx[(sub == "inf") | (sub == "-inf")]
                out[hit] = [" " + v for v in arr[hit]]
        elif kind is float:
            values = arr[idx].astype(np.float64)
            _float_cells(out, idx, values, text)
            if text:
                kept.append(idx[~np.isnan(values)])
        elif kind is type(None):
            out[idx] = "None"
        elif kind is bool:  # never NaN or infinite
            kept.append(idx)
        else:  # ints, bools, numpy scalars...: missing ones as NaN, infinities marked, the rest as they are
            sub = arr[idx]
            missing = pd.isna(sub)
            out[idx[missing]] = "nan"
            if not text:
                inf = ~missing & pd.Series(sub, dtype=object).isin(_INF_VALUES).to_numpy()
                out[idx[inf]] = [_cell_text(v) for v in sub[inf]]
                missing |= inf
            kept.append(idx[~missing])
    return out, (np.sort(np.concatenate(kept)) if kept else ())


def _rendered_columns(table):
    """Each column as a list of cell values, None and infinities already rendered (others as they are:
    ints and bools stay typed for xlsx)."""
    return [_rendered_column(table[name].to_numpy(dtype=object), name in _TEXT_COLUMNS)[0].tolist()
            for name in table.columns]


def _renderable(table):
    import pandas as pd
    cols = _rendered_columns(table)
    return pd.DataFrame({c: pd.Series(v, dtype=object) for c, v in zip(table.columns, cols)})


_CSV_SPECIAL = (",", '"', "\r", "\n")


def _csv_quoted(cell):
    """csv.writer's QUOTE_MINIMAL: quoted when it holds a delimiter, quote or line break."""
    if any(c in cell for c in _CSV_SPECIAL):
        return '"' + cell.replace('"', '""') + '"'
    return cell


def _csv_column(arr, text):
    """The csv text of each cell of one column (what csv.writer writes for the rendered values)."""
    import numpy as np
    import pandas as pd
    out, kept = _rendered_column(arr, text)
    if len(kept):
        out[kept] = list(map(str, out[kept]))
    cells = out.tolist()
    joined = "".join(cells)
    if any(c in joined for c in _CSV_SPECIAL):
        codes, uniques = pd.factorize(out)  # few distinct cells need quoting (shapes, messages, stacks)
        cells = np.array([_csv_quoted(u) for u in uniques], dtype=object)[codes].tolist()
    return cells


# tables longer than this are written by two processes, one half each (forked: no copy of the table)
PARALLEL_CSV_ROWS = 200_000
CSV_CHUNK_ROWS = 65536  # rows rendered and joined into one string per write


def _write_csv_rows(table, path, header):
    columns = [(table[name].to_numpy(dtype=object), name in _TEXT_COLUMNS) for name in table.columns]
    with open_text(path, newline="") as f:
        if header:
            f.write(",".join(_csv_quoted(str(c)) for c in table.columns) + "\r\n")
        # a block of rows at a time: the text of every cell at once would hold the whole file in memory
        for start in range(0, len(table), CSV_CHUNK_ROWS):
            cols = [_csv_column(values[start:start + CSV_CHUNK_ROWS], text) for values, text in columns]
            f.write("\r\n".join(map(",".join, zip(*cols))) + "\r\n")


def write_csv(table, path):
    import multiprocessing
    import shutil
    if len(table) < PARALLEL_CSV_ROWS or not hasattr(os, "fork") or (os.cpu_count() or 1) < 2:
        _write_csv_rows(table, path, True)
        return path
    half = len(table) // 2
    part = path + ".part"
    child = multiprocessing.get_context("fork").Process(target=_write_csv_rows,
                                                        args=(table.iloc[half:], part, False))
    child.start()
    try:
        _write_csv_rows(table.iloc[:half], path, True)
    finally:
        child.join()
    try:
        if child.exitcode != 0:
            raise OSError(f"writing the second half of {path} failed (exit code {child.exitcode})")
        with open(path, "ab") as out, open(part, "rb") as rest:
            shutil.copyfileobj(rest, out, 1 << 20)
    finally:
        if os.path.exists(part):
            os.remove(part)
    return path


class _ZipAt(zipfile.ZipFile):
    """A zip whose every entry carries the time `when` (ZipFile stamps the clock or a file's mtime)."""

    def __init__(self, file, when):
        super().__init__(file, "w", zipfile.ZIP_DEFLATED, allowZip64=True)
        self.when = when

    def _info(self, name):
        info = zipfile.ZipInfo(name, date_time=self.when)
        info.compress_type, info.external_attr = self.compression, 0o600 << 16
        return info

    def writestr(self, name, data, compress_type=None, compresslevel=None):
        info = name if isinstance(name, zipfile.ZipInfo) else self._info(name)
        super().writestr(info, data, compress_type, compresslevel)

    def write(self, filename, arcname=None, compress_type=None, compresslevel=None):
        with open(filename, "rb") as src, self.open(self._info(arcname or os.path.basename(filename)), "w") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def _moment(timestamp):
    """The datetime of a `%Y%m%d%H%M%S` timestamp; now (to the second) when it is none or not one."""
    import datetime
    try:
        when = datetime.datetime.strptime(str(timestamp), "%Y%m%d%H%M%S")
    except ValueError:
        when = datetime.datetime.now().replace(microsecond=0)
    return max(when, datetime.datetime(1980, 1, 1))  # a zip holds no earlier time


def write_xlsx(table, path, timestamp=None, marks=None):
    """`table` as an xlsx at `path`, its cells highlighted as `marks` (RowMarks) say (none without); its
    zip entries and created/modified properties carry `timestamp` (`%Y%m%d%H%M%S`, default now), so equal
    tables and timestamps give equal bytes."""
    from openpyxl import Workbook
    from openpyxl.cell import WriteOnlyCell
    from openpyxl.styles import PatternFill

    if len(table) > EXCEL_MAX_ROWS:
        log.warning("%d rows exceed the xlsx sheet limit; only the first %d are written (use csv for all)",
                    len(table), EXCEL_MAX_ROWS)
        table = table.iloc[:EXCEL_MAX_ROWS]
    fills = {"error": PatternFill("solid", fgColor=RED), "warning": PatternFill("solid", fgColor=YELLOW)}
    label_fills = {k: PatternFill("solid", fgColor=v) for k, v in DIAGNOSIS_FILLS.items()}
    wb = Workbook(write_only=True)
    ws = wb.create_sheet("compare_result")
    columns = list(table.columns)
    ws.append(columns)
    pos = {c: i for i, c in enumerate(columns)}
    result_i, label_i = pos.get(C.RESULT), pos.get(C.DIAGNOSIS)
    levels = marks.verdicts.result if marks is not None and result_i is not None else None
    labels = marks.labels if marks is not None and label_i is not None else None
    for row_i, values in enumerate(_renderable(table).itertuples(index=False, name=None)):
        marked = {}
        level = levels[row_i] if levels is not None else None
        if level in fills:
            marked[result_i] = fills[level]
            for msg in marks.verdicts.messages(row_i):
                marked.update((pos[c], fills[level]) for c in _MESSAGE_COLUMNS.get(msg, ()) if c in pos)
        if labels is not None and labels[row_i] in label_fills:
            marked[label_i] = label_fills[labels[row_i]]
        if not marked:
            ws.append(list(values))
            continue
        row = []
        for i, v in enumerate(values):
            if i in marked:
                cell = WriteOnlyCell(ws, value=v)
                cell.fill = marked[i]
                row.append(cell)
            else:
                row.append(v)
        ws.append(row)
    from openpyxl.writer.excel import ExcelWriter
    when = _moment(timestamp)
    wb.properties.created = wb.properties.modified = when
    with open_text(path, "wb") as f:
        ExcelWriter(wb, _ZipAt(f, when.timetuple()[:6])).save()  # wb.save would stamp the time it ran
    return path


def write_result(table, output_dir, name, timestamp=None, marks=None):
    """Write `table` as `output_dir/name` (csv or xlsx by the suffix; an xlsx carries `timestamp` and is
    highlighted as `marks` say, see write_xlsx); returns the path."""
    make_dirs(output_dir)
    path = os.path.join(output_dir, name)
    return write_xlsx(table, path, timestamp, marks) if name.endswith(".xlsx") else write_csv(table, path)

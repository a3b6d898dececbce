"""The result and details CSV files of one run: created with their headers, appended one API at a
time, and recovered for a resumed run (`-csv_path`).

Each API's details rows, then its result row, go out in one write each, flushed: a SIGKILL can at most
tear the last line or leave details of an API without its result row. `recover()` cuts a torn line and
drops details rows of APIs without a result row, so the resumed run writes each API exactly once.
Must not import torch or mindspore.
"""

import csv
import io
import os
import re

from msprobe.core.acc_check.results import DETAILS_COLUMNS, RESULT_COLUMNS, ApiResult, DetailRow
from msprobe.core.errors import MsprobeError
from msprobe.core.safe_files import make_dirs, open_text

RESULT_PREFIX = "accuracy_checking_result_"
DETAILS_PREFIX = "accuracy_checking_details_"
_RESULT_NAME = re.compile(r"^accuracy_checking_result_(.+)\.csv$")
_OUTPUT_NAME = re.compile(r"^(.*)\.(forward|backward)\.(input|output)(\..*)?$")


def result_csv_name(timestamp):
    return f"{RESULT_PREFIX}{timestamp}.csv"


def details_csv_name(timestamp):
    return f"{DETAILS_PREFIX}{timestamp}.csv"


def case_of_detail(api_name):
    """`Functional.linear.0.backward.output.1` -> `Functional.linear.0`."""
    m = _OUTPUT_NAME.match(api_name)
    return m.group(1) if m else api_name


def _line(cells):
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(cells)
    return buf.getvalue()


def _cut_torn_tail(path):
    """Drop a last line that a kill left without its newline."""
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def read_rows(path):
    """Rows of one of our CSV files as dicts (BOM tolerated)."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f))


class ResultFiles:
    """One run's `accuracy_checking_result_{ts}.csv` and `accuracy_checking_details_{ts}.csv`.

    Args:
        out_dir: where new files go.
        timestamp: the `{ts}` part of new files' names.
        resume_csv: an interrupted run's result CSV; its details CSV must sit beside it. Rows are
            appended to those files instead of new ones.

    Raises:
        MsprobeError: `resume_csv` is not a result CSV of ours, or its details file is missing.
    """

    def __init__(self, out_dir, timestamp, resume_csv=None):
        if resume_csv:
            name = os.path.basename(resume_csv)
            m = _RESULT_NAME.match(name)
            if not m or not os.path.isfile(resume_csv):
                raise MsprobeError(f"-csv_path '{resume_csv}': expected an existing "
                                   f"{RESULT_PREFIX}{{timestamp}}.csv from an interrupted run")
            self.result_path = os.path.abspath(resume_csv)
            self.details_path = os.path.join(os.path.dirname(self.result_path), details_csv_name(m.group(1)))
            if not os.path.isfile(self.details_path):
                raise MsprobeError(f"-csv_path '{resume_csv}': its details file "
                                   f"'{self.details_path}' is missing; both files are needed to resume")
            self.timestamp = m.group(1)
            self.done = self.recover()
        else:
            if os.path.exists(out_dir) and not os.path.isdir(out_dir):
                raise MsprobeError(f"-o '{out_dir}': is a file; expected a directory for the result CSVs")
            make_dirs(out_dir)
            self.timestamp = timestamp
            self.result_path = os.path.join(out_dir, result_csv_name(timestamp))
            self.details_path = os.path.join(out_dir, details_csv_name(timestamp))
            for path, columns in ((self.result_path, RESULT_COLUMNS), (self.details_path, DETAILS_COLUMNS)):
                with open_text(path, encoding="utf-8-sig", newline="") as f:
                    f.write(_line(columns))
            self.done = set()
        self._result = open_text(self.result_path, "a", newline="")
        self._details = open_text(self.details_path, "a", newline="")

    def recover(self):
        """Names of the APIs an interrupted run finished; their rows stay, everything else goes."""
        for path, columns in ((self.result_path, RESULT_COLUMNS), (self.details_path, DETAILS_COLUMNS)):
            _cut_torn_tail(path)
            with open(path, encoding="utf-8-sig", newline="") as f:
                header = next(csv.reader(f), None)
            if header is None:  # killed before the header went out
                with open_text(path, encoding="utf-8-sig", newline="") as f:
                    f.write(_line(columns))
            elif tuple(header) != columns:
                raise MsprobeError(f"-csv_path: '{path}' has columns {header}; expected {list(columns)}")
        done = {row["API Name"] for row in read_rows(self.result_path)}
        details = read_rows(self.details_path)
        kept = [row for row in details if case_of_detail(row["API Name"]) in done]
        if len(kept) != len(details):
            tmp = self.details_path + ".tmp"
            with open_text(tmp, encoding="utf-8-sig", newline="") as f:
                f.write(_line(DETAILS_COLUMNS))
                f.writelines(_line([row[c] for c in DETAILS_COLUMNS]) for row in kept)
            os.replace(tmp, self.details_path)
        return done

    def write(self, result):
        """Append one ApiResult: its details rows first, then its result row."""
        if result.details:
            self._details.write("".join(_line(d.cells()) for d in result.details))
            self._details.flush()
        self._result.write(_line(result.cells()))
        self._result.flush()

    def close(self):
        self._result.close()
        self._details.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def merge_parts(parts, result_path, details_path, order):
    """Merge worker part files (and rows already in the targets) into the two target CSVs.

    Rows are ordered by `order` (API names in dump order); an API present twice keeps one copy.

    Args:
        parts: (result_csv, details_csv) pairs written by workers.
        result_path, details_path: the merged files (rewritten; their current rows are kept).
        order: API names in the order the rows should appear.
    """
    results, details = {}, {}
    for r_path, d_path in [(result_path, details_path)] + list(parts):
        if not (os.path.isfile(r_path) and os.path.isfile(d_path)):
            continue
        _cut_torn_tail(r_path)
        _cut_torn_tail(d_path)
        finished = {}
        for row in read_rows(r_path):
            finished.setdefault(row["API Name"], row)
        grouped = {}
        for row in read_rows(d_path):
            grouped.setdefault(case_of_detail(row["API Name"]), []).append(row)
        for name, row in finished.items():
            if name not in results:
                results[name] = row
                details[name] = grouped.get(name, [])
    rank = {name: i for i, name in enumerate(order)}
    names = sorted(results, key=lambda n: rank.get(n, len(rank)))
    for path, columns, rows in ((result_path, RESULT_COLUMNS, [results[n] for n in names]),
                                (details_path, DETAILS_COLUMNS, [r for n in names for r in details[n]])):
        tmp = path + ".tmp"
        with open_text(tmp, encoding="utf-8-sig", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")  # what _line writes, without a writer per row
            writer.writerow(columns)
            writer.writerows([row.get(c, "") for c in columns] for row in rows)
        os.replace(tmp, path)
    return names


def results_from_csv(result_path, details_path, names, worst_key):
    """ApiResults of the APIs in `names`, read back from merged files (for a multi-worker summary).

    Args:
        worst_key: sort key picking each API's worst details row.
    """
    details = {}
    for row in read_rows(details_path):
        details.setdefault(case_of_detail(row["API Name"]), []).append(DetailRow(
            row["API Name"], row["Bench Dtype"], row["Tested Dtype"], row["Shape"], _float(row["Cosine"]),
            _float(row["MaxAbsErr"]), _float(row["MaxRelativeErr"]), row["Status"], row["Message"],
            _float(row["MaxUlpErr"]), row["ReductionLength"], row["Dtype Status"]))
    results = []
    for row in read_rows(result_path):
        if row["API Name"] in names:
            rows = details.get(row["API Name"], [])
            results.append(ApiResult(row["API Name"], row["Forward Test Success"], row["Backward Test Success"],
                                     row["Message"], row["Forward Dtype Check"], row["Backward Dtype Check"],
                                     rows, min(rows, key=worst_key, default=None)))
    return results


def _float(text):
    try:
        return float(text)
    except ValueError:
        return float("nan")

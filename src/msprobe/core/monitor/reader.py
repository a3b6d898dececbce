"""Reading a monitor output directory back: per-rank CSV files or TensorBoard event files, and the
anomaly records. Accepts msProbe's layout too. Must not import torch or mindspore.

A monitor dir is the output root (holding `*-rank{r}-*` dirs and `anomaly_detected/`) or one rank dir.
"""

import glob
import os
import re

from msprobe.core.errors import DumpFormatError
from msprobe.core.file_limits import check_regular, load_json, open_regular
from msprobe.core.monitor.ops import OPS

_CSV_NAME = re.compile(r"^(?P<tag>.+)_(?P<first>\d+)-(?P<last>\d+)\.csv$")
_RANK_IN_DIR = re.compile(r"rank(\d+)")
_TB_TAG = re.compile(r"^(?P<vpp>\d+):(?P<name>.*?)(?::(?P<micro>\d+))?/rank(?P<rank>\d+)/(?P<tag>.+)_(?P<op>"
                     + "|".join(OPS) + r")$")
COLUMNS = ["rank", "tag", "vpp_stage", "name", "step", "micro_step"]


def _has_data(d):
    return any(_CSV_NAME.match(f) or f.startswith("events.out.tfevents") for f in os.listdir(d))


def find_rank_dirs(path):
    """[(rank, dir)] of the rank dirs under `path` (or `path` itself), sorted by rank then name."""
    if not os.path.isdir(path):
        raise DumpFormatError(f"monitor_report: -i {path!r}: not a directory; expected a monitor output dir")
    candidates = [path] + [os.path.join(path, d) for d in sorted(os.listdir(path))
                           if os.path.isdir(os.path.join(path, d))]
    found = []
    for d in candidates:
        if _has_data(d):
            m = _RANK_IN_DIR.findall(os.path.basename(os.path.normpath(d)))
            found.append((int(m[-1]) if m else 0, d))
    if not found:
        raise DumpFormatError(f"monitor_report: -i {path!r}: no monitor data found; expected rank dirs with "
                              "{tag}_{a}-{b}.csv or events.out.tfevents.* files")
    return sorted(found)


def _read_csvs(rank, rank_dir):
    import pandas as pd

    frames = []
    for f in sorted(os.listdir(rank_dir)):
        m = _CSV_NAME.match(f)
        if not m:
            continue
        try:
            with open_regular(os.path.join(rank_dir, f)) as fh:
                df = pd.read_csv(fh)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise DumpFormatError(f"monitor_report: {os.path.join(rank_dir, f)}: not a monitor CSV ({e})") from None
        if not {"name", "step"} <= set(df.columns):
            raise DumpFormatError(f"monitor_report: {os.path.join(rank_dir, f)}: missing columns name/step; "
                                  f"got {', '.join(map(str, df.columns))}")
        df["tag"] = m.group("tag")
        df["rank"] = rank
        frames.append(df)
    return frames


def _read_events(rank_dir):
    import pandas as pd
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for f in os.listdir(rank_dir):
        if f.startswith("events.out.tfevents"):
            check_regular(os.path.join(rank_dir, f), "MSPROBE_MAX_JSON_BYTES")  # a FIFO would hang the reader
    acc = EventAccumulator(rank_dir, size_guidance={"scalars": 0})
    acc.Reload()
    rows = {}
    for tb_tag in acc.Tags().get("scalars", []):
        m = _TB_TAG.match(tb_tag)
        if not m:
            continue
        micro = int(m.group("micro")) if m.group("micro") is not None else 0
        for ev in acc.Scalars(tb_tag):
            key = (int(m.group("rank")), m.group("tag"), int(m.group("vpp")), m.group("name"), ev.step, micro)
            rows.setdefault(key, {})[m.group("op")] = ev.value
    records = [dict(zip(COLUMNS, key), **ops) for key, ops in rows.items()]
    return [pd.DataFrame.from_records(records)] if records else []


def load_monitor_dir(path):
    """All rows of a monitor dir as one pandas DataFrame.

    Returns:
        DataFrame with columns rank, tag, vpp_stage, name, step, micro_step and one column per op found
        (plus shape/dtype from CSVs); micro_step is 0 where the data has none.

    Raises:
        DumpFormatError: no data, or a file that is not a monitor CSV.
    """
    import pandas as pd

    frames = []
    for rank, d in find_rank_dirs(path):
        frames += _read_csvs(rank, d)
        if any(f.startswith("events.out.tfevents") for f in os.listdir(d)):
            frames += _read_events(d)
    if not frames:
        raise DumpFormatError(f"monitor_report: -i {path!r}: the rank dirs hold no rows")
    df = pd.concat(frames, ignore_index=True)
    if "micro_step" not in df.columns:
        df["micro_step"] = 0
    df["micro_step"] = df["micro_step"].fillna(0).astype(int)
    if "vpp_stage" not in df.columns:
        df["vpp_stage"] = 0
    df["name"] = df["name"].fillna("").astype(str)
    for op in OPS:
        if op in df.columns:
            df[op] = pd.to_numeric(df[op], errors="coerce")
    return df


def load_anomalies(path):
    """Anomaly records from `anomaly_detected/*.json` in `path` or next to it (for a rank dir)."""
    records = []
    for root in (path, os.path.dirname(os.path.normpath(path))):
        files = sorted(glob.glob(os.path.join(root, "anomaly_detected", "*.json")))
        for f in files:
            try:
                data = load_json(f)
            except DumpFormatError as e:
                raise DumpFormatError(f"monitor_report: {e}") from None
            if not isinstance(data, (dict, list)):
                raise DumpFormatError(f"monitor_report: {f}: expected an object or a list of anomaly records, "
                                      f"got {type(data).__name__}")
            records += [r for r in (data.values() if isinstance(data, dict) else data) if isinstance(r, dict)]
        if files:
            break
    return records


_ANOMALY_TAG = re.compile(r"^(?P<vpp>\d+):(?P<name>.*?)(?::(?P<micro>\d+))?/rank(?P<rank>\d+)/(?P<tag>.+)$")
_MSPROBE_OP = re.compile(r"', '(\w+)'\)")


def anomaly_point(record):
    """(rank, tag, name, step, op) an anomaly record points at; op None when it cannot be told."""
    m = _ANOMALY_TAG.match(str(record.get("tag_name", "")))
    if not m:
        return None
    op = record.get("op")
    if op is None:
        found = _MSPROBE_OP.search(str(record.get("message", "")))
        op = found.group(1) if found else None
    step = record.get("step", -1)
    if not isinstance(step, int) or isinstance(step, bool):
        return None  # a step that is not a number marks nothing (the page still lists the record, escaped)
    return int(m.group("rank")), m.group("tag"), m.group("name"), step, op

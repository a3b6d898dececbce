"""The compare's rows as one Parquet part per pair, `<out>/rows/step=S/rank=R/part.parquet`, and what
`--resume` reads back from them.

A part is written under a temporary name and renamed, so a part that exists is complete; it carries
its pair's summary (counts, diagnosis entry, census) in its metadata, which is what lets a resumed
compare skip the pair. `rows/_run.json` names the run the parts belong to (its inputs and options, and
the timestamp of its file names) so that a resume with other inputs is refused, not mixed in.
Needs pyarrow (the `ray` extra). Must not import torch or mindspore.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil

from msprobe.core.errors import MsprobeError

ROWS_DIR = "rows"
PART_FILE = "part.parquet"
RUN_FILE = "_run.json"  # "_" and "." names are skipped by pyarrow/pandas dataset readers
_SUMMARY_KEY = b"msprobe.pair"
_MISSING = {"N/A", "", "None", "nan", "NaN"}


def require_pyarrow(why):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise MsprobeError(f'{why} writes Parquet row parts and needs pyarrow: pip install "msprobe[ray]"') from None


def part_path(rows_dir, step, rank):
    return os.path.join(rows_dir, f"step={int(step or 0)}", f"rank={int(rank or 0)}", PART_FILE)


def _column(series):
    """An Arrow column of a table's column: numbers when every present cell is one (a "12.5%" relative
    error as 12.5, "N/A" as null), booleans when all are, else text."""
    import pandas as pd
    import pyarrow as pa
    if series.dtype != object:
        return pa.array(series, from_pandas=True)
    missing = series.isna() | series.isin(_MISSING)
    present = series[~missing]
    if len(present) and present.map(type).eq(bool).all():
        return pa.array(series.where(~missing, None), pa.bool_(), from_pandas=True)
    if len(present) and not present.map(type).eq(bool).any():
        text = present.astype(str).str.strip()
        numbers = pd.to_numeric(text.str.rstrip("%"), errors="coerce")
        if not numbers.isna().any() or numbers.isna().sum() == text.str.lower().isin(("nan", "inf", "-inf")).sum():
            full = pd.Series(float("nan"), index=series.index)
            full[~missing] = numbers.to_numpy(dtype=float)
            return pa.array(full.to_numpy(), pa.float64(), mask=missing.to_numpy())
    return pa.array([None if m else str(v) for v, m in zip(series.tolist(), missing.tolist())], pa.string())


def write_part(table, rows_dir, step, rank, summary):
    """`table` as the pair's part, `summary` (any picklable) in its metadata; temp name, then rename."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = part_path(rows_dir, step, rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    arrow = pa.table({str(c): _column(table[c]) for c in table.columns})
    arrow = arrow.replace_schema_metadata({_SUMMARY_KEY: pickle.dumps(summary, protocol=pickle.HIGHEST_PROTOCOL)})
    tmp = os.path.join(os.path.dirname(path), f".{PART_FILE}.{os.getpid()}.tmp")
    pq.write_table(arrow, tmp)
    os.replace(tmp, path)
    return path


def read_summary(rows_dir, step, rank):
    """The summary a complete part carries, or None when the pair has no part (not done yet)."""
    import pyarrow.parquet as pq
    path = part_path(rows_dir, step, rank)
    if not os.path.isfile(path):
        return None
    try:
        meta = pq.read_schema(path).metadata or {}
        return pickle.loads(meta[_SUMMARY_KEY])  # our own file, written by the run being resumed
    except (OSError, KeyError, pickle.UnpicklingError, ValueError):
        return None  # unreadable: the pair is done again


def run_signature(plan, naming, precision):
    """What must be the same for a resume to continue a run: the pairs, options and output naming."""
    opts = plan.opts
    doc = {"pairs": [[repr(p.target.path), repr(p.golden.path)] for p in plan.pairs],
           "options": [repr(getattr(opts, k)) for k in ("fuzzy_match", "data_mapping", "cell_mapping",
                                                        "api_mapping", "layer_mapping", "stack", "stack_path")],
           "xlsx": naming["xlsx"], "single_file": naming["single_file"], "precision": precision}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def start_run(output_path, signature, timestamp, resume):
    """The rows folder of this run, made ready; returns (rows dir, timestamp to name files with).

    Without `resume` any parts of an earlier run are removed (a query must not read them). With it,
    the earlier run's timestamp is kept (its files keep their names) and other inputs are refused."""
    rows = os.path.join(output_path, ROWS_DIR)
    run_file = os.path.join(rows, RUN_FILE)
    if resume and os.path.isfile(run_file):
        with open(run_file, encoding="utf-8") as f:
            earlier = json.load(f)
        if earlier.get("signature") != signature:
            raise MsprobeError(f"--resume: {output_path} holds a compare of other dumps or options; "
                               "give the same inputs and options, or another -o without --resume")
        return rows, earlier["timestamp"]
    if os.path.isdir(rows):
        shutil.rmtree(rows)
    os.makedirs(rows)
    tmp = os.path.join(rows, f".{RUN_FILE}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"signature": signature, "timestamp": timestamp}, f)
    os.replace(tmp, run_file)
    return rows, timestamp

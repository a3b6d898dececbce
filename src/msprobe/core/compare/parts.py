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


def _column(values):
    """An Arrow column of a table's object column: numbers when every present cell is one (a "12.5%"
    relative error as 12.5, "N/A" as null), booleans when all are, else text."""
    import pyarrow as pa
    present = [v for v in values if v is not None and not (isinstance(v, str) and v in _MISSING)
               and not (isinstance(v, float) and v != v)]
    if present and all(isinstance(v, bool) for v in present):
        return pa.array([v if isinstance(v, bool) else None for v in values], pa.bool_())
    numbers = []
    for v in values:
        if v is None or (isinstance(v, str) and v.strip() in _MISSING):
            numbers.append(None)
            continue
        if isinstance(v, bool):
            break
        if isinstance(v, (int, float)):
            numbers.append(float(v))
            continue
        try:
            numbers.append(float(str(v).strip().rstrip("%")))
        except ValueError:
            break
    else:
        if present:
            return pa.array(numbers, pa.float64())
    return pa.array([None if v is None else str(v) for v in values], pa.string())


def write_part(table, rows_dir, step, rank, summary):
    """`table` as the pair's part, `summary` (any picklable) in its metadata; temp name, then rename."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = part_path(rows_dir, step, rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    arrow = pa.table({str(c): _column(table[c].tolist()) for c in table.columns})
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

"""The compare's rows as one Parquet part per pair, `<out>/rows/step=S/rank=R/part.parquet`, and what
`--resume` reads back from them.

A part is written under a temporary name and renamed, so a part that exists is complete; it carries
its pair's summary (counts, diagnosis entry, census) in its metadata, which is what lets a resumed
compare skip the pair. The summary is a pickle, so it is signed (HMAC-SHA256 with a key private to the
user, `signing_key`) and a resume unpickles only a summary whose signature holds and whose layout
(`SUMMARY_FORMAT`) is this version's: a part that someone else, or an older msprobe, wrote is compared
again, never loaded, and the resume says so in one line. `rows/_run.json` names the run the parts belong
to (its inputs and options, and the timestamp of its file names) so that a resume with other inputs is
refused, not mixed in. A part's columns are the result table's: its numbers and requires_grad flags come
typed from the pair's rows (the values the cells are rendered from), never parsed back from the cells.
Needs pyarrow (the `ray` extra). Must not import torch or mindspore.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import shutil

import numpy as np

from msprobe.core.compare import columns
from msprobe.core.compare.frame import METRIC_FIELDS, STAT_FIELDS
from msprobe.core.compare.stats_diff import stat_differences
from msprobe.core.compare.table import requires_grad_consistent
from msprobe.core.errors import MsprobeError
from msprobe.core.safe_files import make_dirs, open_text

ROWS_DIR = "rows"
PART_FILE = "part.parquet"
RUN_FILE = "_run.json"  # "_" and "." names are skipped by pyarrow/pandas dataset readers
_SUMMARY_KEY = b"msprobe.pair"
_SIGNATURE_KEY = b"msprobe.pair.hmac"
_FORMAT_KEY = b"msprobe.pair.format"
# the summary's layout (rank_pairs.PairDone holding a diagnosis.results.PairDiagnosis): raise it when that
# changes, so that a resume compares the pairs of parts an older msprobe wrote again instead of loading them
SUMMARY_FORMAT = b"2"


def require_pyarrow(why):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise MsprobeError(f'{why} writes Parquet row parts and needs pyarrow: pip install "msprobe[ray]"') from None


def part_path(rows_dir, step, rank):
    return os.path.join(rows_dir, f"step={int(step or 0)}", f"rank={int(rank or 0)}", PART_FILE)


def _text(values):
    """A text column: the cells as the table shows them (a cell that is no str, as its str)."""
    import pyarrow as pa
    try:
        return pa.array(values, pa.string(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def _numbers(values, missing=None):
    """A float64 column: null where `missing`, else the value (NaN kept: a NaN statistic was involved)."""
    import pyarrow as pa
    return pa.array(np.asarray(values, dtype=np.float64), pa.float64(), mask=missing)


def _statistic(values):
    """A statistic's float column (`frame.numeric`): null where it is absent, not a number, or NaN."""
    return _numbers(values, np.isnan(values))


def _flags(values):
    """A requires_grad column of the rows: True, False, or null where the dump does not say."""
    import pyarrow as pa
    try:
        return pa.array(values, pa.bool_(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # a value that is no bool: only True reads as True
        return pa.array([None if v is None else v is True for v in values], pa.bool_())


def _typed_columns(rows, mode):
    """column name -> Arrow array of the pair's numbers and flags, from its typed rows
    (`frame.PairedRows`): the values the table's cells are rendered from, so no cell is parsed back."""
    cols = {}
    t_rg = rows.target["requires_grad"].to_numpy(dtype=object)
    g_rg = np.where(rows.matched, rows.golden["requires_grad"].to_numpy(dtype=object), None)
    cols["NPU Requires_grad"], cols["Bench Requires_grad"] = _flags(t_rg), _flags(g_rg)
    cols[columns.REQUIRES_GRAD_CONSISTENT] = _flags(requires_grad_consistent(t_rg, g_rg))
    for field, t_name, g_name in zip(STAT_FIELDS, columns.NPU_STATS, columns.BENCH_STATS):
        cols[t_name], cols[g_name] = _statistic(rows.t_num[field][0]), _statistic(rows.g_num[field][0])
    if mode == "statistics":
        typed, _ = stat_differences(rows.t_num, rows.g_num, rows.matched)
        for field, diff_name, rel_name in zip(STAT_FIELDS, columns.STAT_DIFFS, columns.STAT_REL_ERRS):
            diff, rel, absent = typed[field]
            cols[diff_name], cols[rel_name] = _numbers(diff, absent), _numbers(rel * 100.0, absent)  # in %
    elif mode == "tensor":
        one_element = rows.metrics["one_element"]
        for field, name in zip(METRIC_FIELDS, columns.TENSOR_METRICS):
            values = rows.metric(field)
            shown = ~np.isnan(values)
            if field not in ("max_abs", "max_rel"):  # a single element has no cosine, distance or ratio
                shown &= ~one_element
            cols[name] = _numbers(values, ~shown)
    return cols


def part_table(table, rows, mode):
    """The Arrow table of a pair's part: the result table's columns in its order, numbers (float64) and
    requires_grad (bool) from the typed rows, the rest as text. Every part has the same schema per mode."""
    import pyarrow as pa
    typed = _typed_columns(rows, mode)
    return pa.table({str(c): typed[c] if c in typed else _text(table[c].to_numpy(dtype=object))
                     for c in table.columns})


def signing_key():
    """The user's key for part summaries: `$XDG_CACHE_HOME/msprobe/resume.key` (or ~/.cache), 0600,
    made once; where it cannot be kept, a key for this run alone (a resume then compares every pair)."""
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(home, "msprobe", "resume.key")
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                key = f.read(64)
            if len(key) == 32 and os.stat(path).st_uid == os.getuid():
                return key
            raise OSError(f"{path}: not a key of this user")
        key = os.urandom(32)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        return key
    except OSError:
        return os.urandom(32)


def _sign(key, blob, layout=SUMMARY_FORMAT):
    return hmac.new(key, layout + b":" + blob, hashlib.sha256).hexdigest().encode()


def write_part(table, rows, mode, rows_dir, step, rank, summary, key):
    """The pair's part (`part_table` of its result table and typed rows), `summary` (any picklable,
    signed with `key`) in its metadata; temp name, then rename."""
    import pyarrow.parquet as pq
    path = part_path(rows_dir, step, rank)
    make_dirs(os.path.dirname(path))
    arrow = part_table(table, rows, mode)
    blob = pickle.dumps(summary, protocol=pickle.HIGHEST_PROTOCOL)
    arrow = arrow.replace_schema_metadata({_SUMMARY_KEY: blob, _FORMAT_KEY: SUMMARY_FORMAT,
                                           _SIGNATURE_KEY: _sign(key, blob)})
    tmp = os.path.join(os.path.dirname(path), f".{PART_FILE}.{os.getpid()}.tmp")
    pq.write_table(arrow, tmp)
    os.chmod(tmp, 0o640)
    os.replace(tmp, path)
    return path


def read_summary(rows_dir, step, rank, key):
    """(summary, None) of a complete part; (None, None) when the pair has no part (not done yet); (None,
    why) when its part cannot be taken: written by another msprobe version, its summary not signed with
    `key` (written by someone else, or changed), or unreadable. The pair is then compared again."""
    import pyarrow.parquet as pq
    path = part_path(rows_dir, step, rank)
    if not os.path.isfile(path):
        return None, None
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, ValueError) as e:
        return None, f"unreadable ({e})"
    layout = meta.get(_FORMAT_KEY)
    if layout != SUMMARY_FORMAT:
        return None, ("written by an older msprobe" if layout is None else
                      f"written by another msprobe (summary format {layout.decode(errors='replace')!r}, "
                      f"this one reads {SUMMARY_FORMAT.decode()!r})")
    blob, signature = meta.get(_SUMMARY_KEY), meta.get(_SIGNATURE_KEY)
    if blob is None or signature is None or not hmac.compare_digest(signature, _sign(key, blob)):
        return None, "its summary is not signed with this user's key (written by someone else, or changed)"
    try:
        return pickle.loads(blob), None  # signed by this user's key: written by a compare of this user
    except Exception as e:  # noqa: BLE001 -- any failure to load means the pair is compared again
        return None, f"its summary cannot be loaded ({type(e).__name__})"


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
    make_dirs(rows)
    tmp = os.path.join(rows, f".{RUN_FILE}.tmp")
    with open_text(tmp) as f:
        json.dump({"signature": signature, "timestamp": timestamp}, f)
    os.replace(tmp, run_file)
    return rows, timestamp

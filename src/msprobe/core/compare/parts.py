"""The compare's rows as one Parquet part per pair, `<out>/rows/step=S/rank=R/part.parquet`, and what
`--resume` reads back from them.

A part is written under a temporary name and renamed, so a part that exists is complete; it carries
its pair's summary (counts, diagnosis entry, census) in its metadata, which is what lets a resumed
compare skip the pair. The summary is a pickle, so it is signed (HMAC-SHA256 with a key private to the
user, `signing_key`) and a resume unpickles only a summary whose signature holds and whose layout
(`SUMMARY_FORMAT`) is this version's: a part that someone else, or an older msprobe, wrote is compared
again, never loaded, and the resume says so in one line. `rows/_run.json` names the run the parts belong
to (its inputs and options, and the timestamp of its file names) so that a resume with other inputs is
refused, not mixed in.
Needs pyarrow (the `ray` extra). Must not import torch or mindspore.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import shutil

from msprobe.core.compare import columns
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
_MISSING = {"N/A", "", "None", "nan", "NaN"}


def require_pyarrow(why):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise MsprobeError(f'{why} writes Parquet row parts and needs pyarrow: pip install "msprobe[ray]"') from None


def part_path(rows_dir, step, rank):
    return os.path.join(rows_dir, f"step={int(step or 0)}", f"rank={int(rank or 0)}", PART_FILE)


# one type per column name, whatever a pair's cells are: every part of a dataset has the same schema
_NUMBERS = frozenset(columns.TENSOR_METRICS + columns.NPU_STATS + columns.BENCH_STATS + columns.STAT_DIFFS
                     + columns.STAT_REL_ERRS)
_BOOLEANS = frozenset(("NPU Requires_grad", "Bench Requires_grad", columns.REQUIRES_GRAD_CONSISTENT))


def _as_text(values):
    import pyarrow as pa
    try:
        return pa.array(values, pa.string(), from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # numbers among the text: each as its repr
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def _column(name, series):
    """An Arrow column of a table's column: float64 for the metrics and statistics (a "12.5%" relative
    error as 12.5, "N/A" as null), bool for the requires_grad columns, else text. Arrow's kernels where
    the cells allow: a 2000-row pair has 60 000 cells."""
    import pyarrow as pa
    import pyarrow.compute as pc
    values = series.to_numpy(dtype=object)
    kind = pa.float64() if name in _NUMBERS else pa.bool_() if name in _BOOLEANS else pa.string()
    if kind == pa.string():
        return _as_text(values)
    try:
        return pa.array(values, kind, from_pandas=True)  # the cells are of that kind already
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    text = pc.utf8_trim_whitespace(_as_text(values))
    present = pc.invert(pc.fill_null(pc.is_in(text, value_set=pa.array(sorted(_MISSING))), True))
    if kind == pa.bool_():
        return pc.if_else(present, pc.equal(text, "True"), pa.scalar(None, pa.bool_()))
    cleaned = pc.if_else(present, pc.replace_substring_regex(text, "%$", ""), pa.scalar(None, pa.string()))
    try:
        return pc.cast(cleaned, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # a cell that is no number: null, not a failed pair
        return pa.array([_float_or_none(v) for v in cleaned.to_pylist()], pa.float64())


def _float_or_none(v):
    try:
        return None if v is None else float(v)
    except ValueError:
        return None


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


def write_part(table, rows_dir, step, rank, summary, key):
    """`table` as the pair's part, `summary` (any picklable, signed with `key`) in its metadata; temp
    name, then rename."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = part_path(rows_dir, step, rank)
    make_dirs(os.path.dirname(path))
    arrow = pa.table({str(c): _column(str(c), table[c]) for c in table.columns})
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

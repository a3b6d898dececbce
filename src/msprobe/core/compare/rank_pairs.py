"""`msprobe compare` one rank pair at a time: compare, diagnose, write its file, keep only a summary.

A 64-rank, 3-step dump is 192 pairs of a few thousand rows each; every pair's table and rows held until
the end weigh gigabytes, and one core would do it all. Here each pair is compared, labelled and written
as it comes (in worker processes when the compare is big), and what stays is its diagnosis entry and
its row counts. The working precision is decided over all pairs: each pair is labelled with its own
census' decision first, and the rare pair whose decision differs from the overall one is done again.
Must not import torch or mindspore.
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, field, replace

from msprobe.core.compare.engines.summary import Interner, slim_suspects
from msprobe.core.compare.writer import RowMarks, result_file_name, write_result
from msprobe.core.diagnosis.census import PrecisionCensus
from msprobe.core.diagnosis.evidence import trim_evidence
from msprobe.core.diagnosis.labels import label_table
from msprobe.core.diagnosis.pair import diagnose_pair
from msprobe.core.diagnosis.results import PairDiagnosis
from msprobe.core.errors import MsprobeError, where

# worker processes pay off above this much dump.json (both sides, all pairs) and this many pairs
PARALLEL_MIN_BYTES = 32 << 20
PARALLEL_MIN_PAIRS = 4
# from this many pairs on, every engine's driver keeps no suspect's rows (the listed few are read again)
LEAN_MIN_PAIRS = 256
_LOGGER = "msprobe"


@dataclass
class PairJob:
    """What a worker needs for one pair besides the plan."""

    index: int
    output_path: str
    naming: dict          # writer.result_file_name's several_steps, single_file, xlsx, timestamp
    working: tuple | None  # (dtype, unit roundoff) to label with; None: the pair's own census decides
    keep_table: bool
    rows_dir: str | None = None  # write the pair's Parquet part (parts.py) into this rows folder
    write: bool = True    # write its files (False: only its diagnosis entry again)
    lean: bool = False    # keep no suspect's evidence (read again if listed): the driver holds counts only
    rows_key: bytes = b""  # signs the part's summary (parts.signing_key)


@dataclass
class PairDone:
    """A pair compared, labelled and written."""

    index: int
    result: object        # CompareResult; its table (and rows) only when the job kept them
    entry: object         # its PairDiagnosis (diagnosis.pair.diagnose_pair)
    census: PrecisionCensus
    used: tuple           # the working precision it was labelled with
    logs: list            # log records it made (a worker's, re-emitted by the parent)


@dataclass
class PairFailed:
    """A pair that could not be compared (a corrupt or missing dump, a worker lost): the others go on."""

    index: int
    step: int | None
    rank: int | None
    is_proc: bool
    error: str
    logs: list = field(default_factory=list)

    def line(self):
        return f"{where(self.step, self.rank, self.is_proc)}: skipped: {self.error}"


def result_counts(result):
    """{"error": n, "warning": n, "pass": n, "N/A": n} of a result's verdicts, in that order."""
    verdicts = getattr(result.rows, "verdicts", None)
    if verdicts is None:  # rows let go once written: their counts stay
        return dict(result.counts)
    return verdicts.counts()


def run_pair(plan, pair, job, opts=None, write=True):
    """Compare, label and write one pair (PairDone); with `job.rows_dir`, its Parquet part last (the
    part's presence says the pair is complete)."""
    write = write and job.write
    result = plan.compare(pair, opts)
    census = PrecisionCensus()
    census.add(result)
    used = job.working or census.decide()
    entry = diagnose_pair(result, used[1])
    entry.pair_index = job.index
    label_table(result.table, entry.labels)
    marks = RowMarks(result.rows.verdicts, entry.labels)
    if not job.keep_table:
        entry.labels = None  # written into the table: the driver keeps the counts
        if job.lean:
            trim_evidence(entry, keep=0)
        else:
            trim_evidence(entry)
        entry.suspects = slim_suspects(entry.suspects)  # what goes back to the driver: small
    debug = not os.path.isfile(os.path.join(result.target_dir, "dump.json"))  # a debug.json dump
    name = result_file_name(result.step, result.rank, result.is_proc, debug=debug, **job.naming)
    result.output_path = os.path.join(job.output_path, name)
    if write:
        write_result(result.table, job.output_path, name, job.naming["timestamp"], marks)
    table, rows = result.table, result.rows
    result.counts = result_counts(result)
    result.row_count = len(table)
    if not job.keep_table:
        result.table = result.rows = None
        result.stacks, result.construct = {}, {}
    done = PairDone(job.index, result, entry, census, used, [])
    if write and job.rows_dir:
        from msprobe.core.compare.parts import write_part
        write_part(table, rows, result.mode, job.rows_dir, result.step, result.rank, done, job.rows_key)
    return done


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records = []

    def emit(self, record):
        record.msg, record.args = record.getMessage(), None  # picklable whatever the arguments were
        self.records.append(record)


@dataclass
class _Shared:
    """What every pair's task shares: sent once to each worker (or once to the cluster)."""

    plan: object
    opts: object          # the plan's options as a worker uses them
    collect_logs: bool    # a worker's log records go back with its outcome
    isolate: bool         # a pair that fails is reported (PairFailed), not raised


def _run_task(shared, job):
    """One pair in a worker (or in this process): its PairDone, or PairFailed when its dumps cannot be
    compared; a worker's log records come back to the parent (which says each once)."""
    logger, handler = logging.getLogger(_LOGGER), _Collect()
    if shared.collect_logs:
        propagate, logger.propagate = logger.propagate, False
        logger.addHandler(handler)
    pair = shared.plan.pairs[job.index]
    try:
        done = run_pair(shared.plan, pair, job, shared.opts)
    except Exception as e:  # noqa: BLE001 - one pair's bad dump must not stop a thousand others
        if not shared.isolate:
            raise
        logger.debug("rank pair %d failed", job.index, exc_info=True)
        message = str(e) if isinstance(e, (MsprobeError, OSError)) else f"{type(e).__name__}: {e}"
        done = PairFailed(job.index, pair.target.step, pair.target.rank, pair.target.is_proc,
                          message.splitlines()[0] if message else type(e).__name__)
    finally:
        if shared.collect_logs:
            logger.removeHandler(handler)
            logger.propagate = propagate
    done.logs = handler.records
    return done


def _worker_count(plan):
    if len(plan.pairs) < PARALLEL_MIN_PAIRS or not hasattr(os, "fork"):
        return 1
    from msprobe.core.compare.engine import dump_size
    if sum(dump_size(p.target) + dump_size(p.golden) for p in plan.pairs) < PARALLEL_MIN_BYTES:
        return 1
    from msprobe.core.compare.tensor_mode import default_workers
    return min(plan.opts.workers or default_workers(), len(plan.pairs))


def _shared(plan, engine):
    if engine.inline:
        opts = plan.opts
    else:  # each worker compares one pair at a time, its tensors without workers of its own
        opts = replace(plan.opts, workers=1, progress=False)
    return _Shared(plan, opts, collect_logs=not engine.inline, isolate=len(plan.pairs) > 1)


def run_pairs(plan, jobs, engine, progress=True, interner=None):
    """PairDone or PairFailed of every job, in the jobs' order, each pair done once, on `engine`; with
    `interner`, each pair's trimmed suspects share what earlier pairs' hold."""
    from tqdm import tqdm
    from msprobe.core.compare.engines import TaskLost
    bar = tqdm(total=len(jobs), desc="compare", unit="rank pair", leave=False,
               disable=not progress or len(jobs) < 2)
    out, seen, failed = [None] * len(jobs), set(), 0
    try:
        for k, d in engine.run(_run_task, _shared(plan, engine), jobs):
            if isinstance(d, TaskLost):
                p = plan.pairs[jobs[k].index]
                d = PairFailed(jobs[k].index, p.target.step, p.target.rank, p.target.is_proc, d.message)
            for record in d.logs:
                said = (record.name, record.levelno, record.msg)
                if said not in seen:
                    seen.add(said)
                    logging.getLogger(record.name).handle(record)
            d.logs = []
            if interner is not None and isinstance(d, PairDone):
                d.entry.suspects = interner.suspects(d.entry.suspects)
            out[k] = d
            failed += isinstance(d, PairFailed)
            bar.update()
            if not engine.inline:
                bar.set_postfix(done=bar.n - failed, failed=failed, running=min(engine.slots, len(jobs) - bar.n),
                                refresh=False)
        return out
    finally:
        bar.close()


def _say_refused(refused):
    """One line for the parts a resume could not take (their pairs are compared again)."""
    (path, why), more = refused[0], len(refused) - 1
    others = f" (and {more} more part{'s' if more > 1 else ''})" if more else ""
    logging.getLogger(__name__).warning("--resume: %s%s: %s; comparing %s again", path, others, why,
                                        "their pairs" if more else "its pair")


def compare_and_label(plan, output_path, *, xlsx=False, precision=None, timestamp=None, keep_tables=True,
                      progress=True, single_file=False, engine=None, rows=False, resume=False):
    """Every pair of `plan` compared, labelled and written into `output_path`.

    Args:
        engine: where the pairs run (engines.open_engine); default: the process pool, sized to the compare.
        rows: write each pair's Parquet part under `output_path/rows` (parts.py).
        resume: skip the pairs whose parts an earlier run of the same compare completed (implies rows).

    Returns:
        (results, entries, (working dtype, unit roundoff), reload, failed): CompareResults in pair order
        (tables only with `keep_tables`), their PairDiagnosis, the working precision over all pairs,
        what `diagnosis.combine` calls to read a pair's trimmed evidence again, and the
        PairFailed of the pairs that could not be compared.

    Raises:
        MsprobeError: no pair could be compared (the first one's error).
    """
    given = PrecisionCensus().decide(precision) if precision is not None else None  # checked before any work
    naming = {"several_steps": len({p.target.step for p in plan.pairs}) > 1, "single_file": single_file,
              "xlsx": xlsx, "timestamp": timestamp}
    rows_dir, rows_key = None, b""
    if rows or resume:
        from msprobe.core.compare import parts
        parts.require_pyarrow("--resume" if resume else "the Ray engine")
        rows_dir, naming["timestamp"] = parts.start_run(output_path, parts.run_signature(plan, naming, precision),
                                                        timestamp, resume)
        rows_key = parts.signing_key()
    if engine is None:
        from msprobe.core.compare.engines import open_engine
        engine = open_engine("pool", workers=_worker_count(plan))
    lean = getattr(engine, "lean_driver", False) or len(plan.pairs) >= LEAN_MIN_PAIRS
    jobs = [PairJob(i, output_path, naming, given, keep_tables, rows_dir, lean=lean, rows_key=rows_key)
            for i in range(len(plan.pairs))]
    done = [None] * len(jobs)
    interner = None if keep_tables else Interner()  # a thousand pairs' suspects in tens of MB
    if resume and not keep_tables:  # a part holds no table: a run that keeps them compares every pair
        refused = []
        for job, pair in zip(jobs, plan.pairs):
            kept, why = parts.read_summary(rows_dir, pair.target.step, pair.target.rank, rows_key)
            if kept is not None and not (isinstance(kept, PairDone) and isinstance(kept.entry, PairDiagnosis)
                                         and kept.index == job.index):
                kept, why = None, "its summary is not this msprobe's for this pair"
            if why is not None:
                refused.append((parts.part_path(parts.ROWS_DIR, pair.target.step, pair.target.rank), why))
            if kept is not None:
                kept.entry.suspects = interner.suspects(kept.entry.suspects)
                done[job.index] = kept
        if refused:
            _say_refused(refused)
    todo = [j for j in jobs if done[j.index] is None]
    for job, d in zip(todo, run_pairs(plan, todo, engine, progress, interner)):
        done[job.index] = d
    failed = [d for d in done if isinstance(d, PairFailed)]
    done = [d for d in done if isinstance(d, PairDone)]
    if not done:
        raise MsprobeError(failed[0].line())
    census = PrecisionCensus()
    for d in done:
        census.merge(d.census)
    working = given or census.decide()
    # a pair alone pointed elsewhere: label it with the run's precision
    again = [replace(jobs[d.index], working=working) for d in done if d.used != working]
    by_index = {d.index: k for k, d in enumerate(done)}
    for job, d in zip(again, run_pairs(plan, again, engine, progress=False, interner=interner)):
        if isinstance(d, PairFailed):
            raise MsprobeError(d.line())
        done[by_index[job.index]] = d

    @functools.lru_cache(maxsize=4)  # a pair's suspects are restored one after another
    def reload_pair(index):
        job = replace(jobs[index], working=working, keep_table=True, write=False)
        if engine.name == "pool":  # one pair: no worker processes started for it
            return run_pair(plan, plan.pairs[index], job).entry
        d = run_pairs(plan, [job], engine, progress=False)[0]  # tensors are read where the engine runs
        if isinstance(d, PairFailed):
            raise MsprobeError(d.line())
        return d.entry

    def reload(entry):  # a trimmed suspect listed after all (diagnosis.combine)
        return reload_pair(entry.pair_index)

    return [d.result for d in done], [d.entry for d in done], working, reload, failed

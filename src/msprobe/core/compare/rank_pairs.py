"""`msprobe compare` one rank pair at a time: compare, diagnose, write its file, keep only a summary.

A 64-rank, 3-step dump is 192 pairs of a few thousand rows each; holding every pair's table and rows
until the end took gigabytes, and one core did it all. Here each pair is compared, labelled and written
as it comes (in worker processes when the compare is big), and what stays is its diagnosis entry and
its row counts. The working precision is decided over all pairs: each pair is labelled with its own
census' decision first, and the rare pair whose decision differs from the overall one is done again.
Must not import torch or mindspore.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
from dataclasses import dataclass, replace

from msprobe.core.compare.writer import result_file_name, write_result
from msprobe.core.diagnosis.suspects import PrecisionCensus, diagnose_pair, trim_evidence
from msprobe.core.errors import DumpFormatError, MsprobeError, where

# worker processes pay off above this much dump.json (both sides, all pairs) and this many pairs
PARALLEL_MIN_BYTES = 32 << 20
PARALLEL_MIN_PAIRS = 4
_LOGGER = "msprobe"


@dataclass
class PairJob:
    """What a worker needs for one pair besides the plan."""

    index: int
    output_path: str
    naming: dict          # writer.result_file_name's several_steps, single_file, xlsx, timestamp
    working: tuple | None  # (dtype, unit roundoff) to label with; None: the pair's own census decides
    keep_table: bool


@dataclass
class PairDone:
    """A pair compared, labelled and written."""

    index: int
    result: object        # CompareResult; its table (and rows) only when the job kept them
    entry: dict           # its diagnosis entry (diagnosis.suspects.diagnose_pair)
    census: PrecisionCensus
    used: tuple           # the working precision it was labelled with
    logs: list            # log records it made (a worker's, re-emitted by the parent)


def result_counts(result):
    """{"error": n, "warning": n, "pass": n, "N/A": n} of a result's Result column, in that order."""
    if result.table is None:
        return dict(result.counts)
    counts = result.table["Result"].value_counts().to_dict() if len(result.table) else {}
    return {k: int(counts[k]) for k in ("error", "warning", "pass", "N/A") if k in counts}


def run_pair(plan, pair, job, opts=None, write=True):
    """Compare, label and write one pair (PairDone)."""
    result = plan.compare(pair, opts)
    census = PrecisionCensus()
    census.add(result)
    used = job.working or census.decide()
    entry = diagnose_pair(result, used[1])
    entry["_pair"] = job.index
    if not job.keep_table:
        trim_evidence(entry)
    debug = not os.path.isfile(os.path.join(result.target_dir, "dump.json"))  # a debug.json dump
    name = result_file_name(result.step, result.rank, result.is_proc, debug=debug, **job.naming)
    result.output_path = os.path.join(job.output_path, name)
    if write:
        write_result(result.table, job.output_path, name)
    result.counts = result_counts(result)
    result.row_count = len(result.table)
    if not job.keep_table:
        result.table = result.rows = None
        result.stacks, result.construct = {}, {}
    return PairDone(job.index, result, entry, census, used, [])


@dataclass
class PairSkipped:
    """A pair whose dump could not be read (truncated, corrupt, refused): named, and the rest go on."""

    index: int
    line: str             # "step 1 rank 0: <the reader's one-line error>"
    logs: list


def _run_or_skip(plan, pair, job, opts=None):
    try:
        return run_pair(plan, pair, job, opts)
    except DumpFormatError as e:
        side = pair.target
        place = where(side.step, side.rank, side.is_proc) if side.step is not None else "dump"
        return PairSkipped(job.index, f"{place}: skipped: {e}", [])


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records = []

    def emit(self, record):
        record.msg, record.args = record.getMessage(), None  # picklable whatever the arguments were
        self.records.append(record)


def _run_in_worker(task):
    """A worker's pair: its log records come back to the parent (which says each once) instead of
    going to stderr here."""
    plan, pair, job, opts = task
    logger, handler = logging.getLogger(_LOGGER), _Collect()
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(handler)
    try:
        done = _run_or_skip(plan, pair, job, opts)
    finally:
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


def run_pairs(plan, jobs, progress=True):
    """PairDone (or PairSkipped) of every pair, in pair order, each pair done once; with worker processes when the
    compare is big (each worker compares one pair at a time, its tensors without workers of its own)."""
    from tqdm import tqdm
    workers = _worker_count(plan)
    bar = tqdm(total=len(jobs), desc="compare", unit="rank pair", leave=False,
               disable=not progress or len(jobs) < 2)
    done = []
    try:
        if workers <= 1:
            for pair, job in zip(plan.pairs, jobs):
                done.append(_run_or_skip(plan, pair, job))
                bar.update()
            return done
        from concurrent.futures import ProcessPoolExecutor
        inner = replace(plan.opts, workers=1, progress=False)
        # fork: spawned workers would re-run the caller's __main__ (a training script, a notebook)
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
            tasks = [(plan, pair, job, inner) for pair, job in zip(plan.pairs, jobs)]
            seen = set()
            for d in pool.map(_run_in_worker, tasks, chunksize=1):
                for record in d.logs:
                    said = (record.name, record.levelno, record.msg)
                    if said not in seen:
                        seen.add(said)
                        logging.getLogger(record.name).handle(record)
                done.append(d)
                bar.update()
        return done
    finally:
        bar.close()


def compare_and_label(plan, output_path, *, xlsx=False, precision=None, timestamp=None, keep_tables=True,
                      progress=True, single_file=False):
    """Every pair of `plan` compared, labelled and written into `output_path`.

    Returns:
        (results, entries, (working dtype, unit roundoff), reload, skipped): CompareResults in pair order
        (tables only with `keep_tables`), their diagnosis entries, the working precision over all pairs,
        what `diagnosis.suspects.combine` calls to read a pair's trimmed evidence again, and one line per
        pair whose dump could not be read (skipped; the others are compared).

    Raises:
        MsprobeError: no pair could be read (the first one's error).
    """
    given = PrecisionCensus().decide(precision) if precision is not None else None  # checked before any work
    naming = {"several_steps": len({p.target.step for p in plan.pairs}) > 1, "single_file": single_file,
              "xlsx": xlsx, "timestamp": timestamp}
    jobs = [PairJob(i, output_path, naming, given, keep_tables) for i in range(len(plan.pairs))]
    done = run_pairs(plan, jobs, progress)
    skipped = [d.line for d in done if isinstance(d, PairSkipped)]
    done = [d for d in done if not isinstance(d, PairSkipped)]
    if not done:
        raise MsprobeError(skipped[0].split(": skipped: ", 1)[-1] if len(skipped) == 1 else
                           f"no pair could be read; first: {skipped[0]}")
    census = PrecisionCensus()
    for d in done:
        census.merge(d.census)
    working = given or census.decide()
    for k, d in enumerate(done):
        if d.used != working:  # this pair alone pointed elsewhere: label it with the run's precision
            job = replace(jobs[d.index], working=working)
            done[k] = run_pair(plan, plan.pairs[d.index], job)

    def reload(entry):  # a trimmed suspect listed after all (diagnosis.suspects.combine)
        again = replace(jobs[entry["_pair"]], working=working, keep_table=True)
        return run_pair(plan, plan.pairs[entry["_pair"]], again, write=False).entry

    return [d.result for d in done], [d.entry for d in done], working, reload, skipped

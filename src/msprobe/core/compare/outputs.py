"""`msprobe compare` as one Python call: compare, diagnose, write the result files (named as msProbe
names them) and diagnosis.json, and say what was found. The command line only prints what this returns.

Must not import torch or mindspore.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from msprobe.core.safe_files import make_dirs, open_text

DIAGNOSIS_FILE = "diagnosis.json"


@dataclass
class CompareOutputs:
    """What `write_compare` wrote and found.

    Attributes:
        results: CompareResult per step and rank, each with `output_path` (its csv/xlsx), `counts`
            (rows per Result), `row_count`, and (with keep_tables) a table holding the Diagnosis column.
        diagnosis: the typed Diagnosis (`msprobe.core.diagnosis.results`); `to_json()` is diagnosis.json.
        diagnosis_path: where diagnosis.json was written.
        pairing: one line per step where a run was chosen among several `proc{pid}` runs.
        failed_pairs: one line per pair that could not be compared (a corrupt or missing dump, a lost
            worker); the other pairs were compared, and diagnosis.json lists these under "failed_pairs".
    """

    results: list
    diagnosis: object
    diagnosis_path: str
    pairing: list = field(default_factory=list)
    failed_pairs: list = field(default_factory=list)

    @property
    def files(self):
        return [r.output_path for r in self.results]

    @property
    def divergence(self):
        return self.diagnosis.divergence

    @property
    def mostly_unmatched(self):
        return self.diagnosis.mostly_unmatched

    @property
    def failed(self):
        """What --fail-on-divergence fails on: a divergence, or two dumps that mostly do not match."""
        return self.divergence or self.mostly_unmatched

    def __bool__(self):
        return not self.failed


def write_compare(target_path, golden_path, output_path="./output", *, xlsx=False, precision=None,
                  timestamp=None, keep_tables=True, engine="pool", address=None, resume=False, **compare_kwargs):
    """Compare two dumps, diagnose, and write what `msprobe compare` writes.

    Args:
        target_path, golden_path: as for `compare_dumps`.
        output_path: folder for the result files and diagnosis.json (made when missing).
        xlsx: write xlsx (Result and Diagnosis cells highlighted) instead of csv.
        precision: the target's working precision for the diagnosis; defaults to inferred.
        timestamp: the `{ts}` of the file names; defaults to now.
        keep_tables: keep every pair's table in the returned results; without it each pair's table is
            dropped once written (a many-rank compare then holds one pair at a time) and the results
            keep their row counts (`counts`, `row_count`).
        engine: where the rank pairs run: "pool" (worker processes on this host, the default) or "ray"
            (one Ray task per pair; pip install "msprobe[ray]"). The result files are the same.
        address: the Ray cluster to attach to (engine "ray"); default RAY_ADDRESS, else a local Ray.
        resume: skip the pairs an interrupted run of the same compare into `output_path` completed
            (their Parquet parts under `output_path/rows`); the files are those of an uninterrupted run.
        **compare_kwargs: `compare_dumps` options (mappings, fuzzy_match, stack_path, target_run ...).

    Returns:
        CompareOutputs; false when the diagnosis finds a divergence or the dumps mostly do not match.

    Raises:
        MsprobeError: bad inputs (see `compare_dumps`, `diagnose`); no pair readable. A damaged step or
            rank among readable ones is skipped and named in `failed_pairs`.

    Example:
        >>> out = write_compare("run_bf16/dump", "run_fp32/dump", "out")      # doctest: +SKIP
        >>> out.files, out.diagnosis.verdict                                  # doctest: +SKIP
    """
    from msprobe.core.compare.engine import compare_plan
    from msprobe.core.compare.engines import ENGINES, open_engine
    from msprobe.core.errors import ConfigError
    from msprobe.core.compare.rank_pairs import compare_and_label
    from msprobe.core.diagnosis.combine import combine

    if engine not in ENGINES:
        raise ConfigError("engine", engine, ", ".join(ENGINES))
    if address is not None and engine != "ray":
        raise ConfigError("--address", address, "only with --engine ray")
    if compare_kwargs.get("workers") is not None and compare_kwargs["workers"] < 1:
        raise ConfigError("--workers", compare_kwargs["workers"], "an integer >= 1")
    plan = compare_plan(target_path, golden_path, **compare_kwargs)
    make_dirs(output_path)
    pairs_on = open_engine(engine, address=address) if engine != "pool" or address is not None else None
    try:
        results, entries, (working, working_u), reload, failed = compare_and_label(
            plan, output_path, xlsx=xlsx, precision=precision,
            timestamp=timestamp or time.strftime("%Y%m%d%H%M%S"), keep_tables=keep_tables,
            progress=plan.opts.progress, single_file=os.path.isfile(target_path), engine=pairs_on,
            rows=engine == "ray", resume=resume)
        diagnosis = combine(entries, working, working_u, inferred=precision is None, reload=reload)
    finally:
        if pairs_on is not None:
            pairs_on.close()
    if failed:
        diagnosis.failed_pairs = [{"step": f.step, "rank": f.rank, "error": f.error} for f in failed]
    path = os.path.join(output_path, DIAGNOSIS_FILE)
    with open_text(path) as f:
        json.dump(diagnosis.to_json(), f, indent=1)
    pairing = list(dict.fromkeys(r.pairing for r in results if r.pairing))
    return CompareOutputs(results=results, diagnosis=diagnosis, diagnosis_path=path, pairing=pairing,
                          failed_pairs=[f.line() for f in failed])

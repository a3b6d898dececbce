"""`msprobe compare` as one Python call: compare, diagnose, write the result files (named as msProbe
names them) and diagnosis.json, and say what was found. The command line only prints what this returns.

Must not import torch or mindspore.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

DIAGNOSIS_FILE = "diagnosis.json"


@dataclass
class CompareOutputs:
    """What `write_compare` wrote and found.

    Attributes:
        results: CompareResult per step and rank, each with `output_path` (its csv/xlsx) and a table
            holding the Diagnosis column.
        diagnosis: diagnosis.json's content (see `msprobe.core.diagnosis.diagnose`).
        diagnosis_path: where diagnosis.json was written.
        pairing: one line per step where a run was chosen among several `proc{pid}` runs.
    """

    results: list
    diagnosis: dict
    diagnosis_path: str
    pairing: list = field(default_factory=list)

    @property
    def files(self):
        return [r.output_path for r in self.results]

    @property
    def divergence(self):
        return bool(self.diagnosis.get("divergence"))

    @property
    def mostly_unmatched(self):
        return bool(self.diagnosis.get("mostly_unmatched"))

    @property
    def failed(self):
        """What --fail-on-divergence fails on: a divergence, or two dumps that mostly do not match."""
        return self.divergence or self.mostly_unmatched

    def __bool__(self):
        return not self.failed


def result_counts(result):
    """{"error": n, "warning": n, "pass": n, "N/A": n} of a result's Result column, in that order."""
    counts = result.table["Result"].value_counts().to_dict() if len(result.table) else {}
    return {k: int(counts[k]) for k in ("error", "warning", "pass", "N/A") if k in counts}


def write_compare(target_path, golden_path, output_path="./output", *, xlsx=False, precision=None,
                  timestamp=None, **compare_kwargs):
    """Compare two dumps, diagnose, and write what `msprobe compare` writes.

    Args:
        target_path, golden_path: as for `compare_dumps`.
        output_path: folder for the result files and diagnosis.json (made when missing).
        xlsx: write xlsx (Result and Diagnosis cells highlighted) instead of csv.
        precision: the target's working precision for the diagnosis; defaults to inferred.
        timestamp: the `{ts}` of the file names; defaults to now.
        **compare_kwargs: `compare_dumps` options (mappings, fuzzy_match, stack_path, target_run ...).

    Returns:
        CompareOutputs; false when the diagnosis finds a divergence or the dumps mostly do not match.

    Raises:
        MsprobeError: bad inputs (see `compare_dumps`, `diagnose`).

    Example:
        >>> out = write_compare("run_bf16/dump", "run_fp32/dump", "out")      # doctest: +SKIP
        >>> out.files, out.diagnosis["verdict"]                               # doctest: +SKIP
    """
    from msprobe.core.compare.engine import compare_dumps
    from msprobe.core.compare.writer import result_file_name, write_result
    from msprobe.core.diagnosis import diagnose

    results = compare_dumps(target_path, golden_path, **compare_kwargs)
    diagnosis = diagnose(results, precision=precision)
    ts = timestamp or time.strftime("%Y%m%d%H%M%S")
    single_file = os.path.isfile(target_path)
    several_steps = len({r.step for r in results}) > 1
    os.makedirs(output_path, exist_ok=True)
    for r in results:
        debug = not os.path.isfile(os.path.join(r.target_dir, "dump.json"))  # a debug.json dump
        name = result_file_name(r.step, r.rank, r.is_proc, several_steps, single_file, xlsx, ts, debug)
        r.output_path = write_result(r.table, output_path, name)
    path = os.path.join(output_path, DIAGNOSIS_FILE)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(diagnosis, f, indent=1)
    pairing = list(dict.fromkeys(r.pairing for r in results if r.pairing))
    return CompareOutputs(results=results, diagnosis=diagnosis, diagnosis_path=path, pairing=pairing)

"""`diagnose(results)`: the API or module where error is *introduced*, ranked over steps and ranks.

Reads each compare pair's typed rows (`CompareResult.rows`), stacks and construct.json as compare
loaded them, decides the run's working precision (`census.py`), diagnoses every pair (`pair.py`),
ranks the suspects over all pairs (`ranking.py`) and says the verdict (`verdict.py`): a typed
`results.Diagnosis`. Must not import torch or mindspore.
"""
from __future__ import annotations

from msprobe.core.diagnosis import flow
from msprobe.core.diagnosis.census import PrecisionCensus
from msprobe.core.diagnosis.evidence import restore_evidence
from msprobe.core.diagnosis.labels import label_table
from msprobe.core.diagnosis.pair import diagnose_pair
from msprobe.core.diagnosis.ranking import listed_suspect, rank_suspects, receiving_ranks
from msprobe.core.diagnosis.results import Diagnosis, Precision
from msprobe.core.diagnosis.thresholds import (AMPLIFICATION, DTYPE_NOISE_FLOOR, INTRODUCED_RATIO, MAX_SUSPECTS,
                                               MIN_MATCHED_SHARE, ROUNDING_UNITS, WORKING_PRECISION_SHARE)
from msprobe.core.diagnosis import verdict
from msprobe.core.gc_pause import CollectorPause


def diagnose(results, precision=None):
    """Name where error enters, from the results of one compare, and label every row.

    Args:
        results: CompareResults (one per step and rank) from `compare_dumps`; any other object with
            `table` (and optionally `step`, `rank`, `mode`) is read back through
            `compare.table_reader.result_from_table` (its table's rows without a record name are left out).
        precision: the precision the target may round to everywhere (a float dtype name such as
            "bfloat16", or "tf32" for accelerators whose float32 matmuls round to it). Defaults to the
            coarsest float dtype the target holds where golden holds a finer one, on at least a tenth of
            the compared tensors (autocast's dtype); without one, golden's own precision.

    Returns:
        Diagnosis: `divergence`, `mostly_unmatched`, `verdict`, `suspects` (Suspect), `pairs`
        (PairDiagnosis per step and rank, with its row `labels`) ...; `to_json()` is diagnosis.json's
        content, and the Diagnosis reads as that mapping too. Each result's table gains the `Diagnosis`
        column (after `Err_message`): introduces, marginal, inherits, rounding, agrees or unmatched.

    Raises:
        MsprobeError: `precision` is not a known precision.

    Example:
        >>> from msprobe.core.compare import compare_dumps                 # doctest: +SKIP
        >>> d = diagnose(compare_dumps("run_bf16", "run_fp32"))              # doctest: +SKIP
        >>> d.suspects[0].api                                                # doctest: +SKIP
        'Functional.softmax.1.forward'
    """
    results = sorted((_typed(r) for r in results), key=lambda r: (r.step or 0, r.rank or 0))
    census = PrecisionCensus()
    for res in results:
        census.add(res)
    working, working_u = census.decide(precision)
    pairs = []
    for res in results:
        pair = diagnose_pair(res, working_u)
        label_table(res.table, pair.labels)
        pairs.append(pair)
    return combine(pairs, working, working_u, inferred=precision is None)


def combine(pairs, working, working_u, inferred=True, reload=None):
    """The Diagnosis of a run from the PairDiagnosis of every step and rank.

    `reload(pair)` gives a pair again with every suspect's evidence: needed only when a suspect whose
    evidence `evidence.trim_evidence` let go is among the ones listed."""
    # grouping and ranking make an object or three per suspect while the suspects' rows are alive (a
    # million on a big pair): collections meanwhile walked them all, again and again
    with CollectorPause():
        return _combine(pairs, working, working_u, inferred, reload)


def _combine(pairs, working, working_u, inferred, reload):
    pairs = sorted(pairs, key=lambda p: (p.step, p.rank))
    groups = rank_suspects(pairs)
    for g in groups[:MAX_SUSPECTS]:
        if g.suspect.trimmed:
            restore_evidence(g.suspect, g.pair, reload)
    suspects = [listed_suspect(g) for g in groups[:MAX_SUSPECTS]]
    modes = sorted({p.mode for p in pairs})
    # Marginal suspects (weak) are listed but are not a divergence: two correct runs on different
    # hardware get there, and --fail-on-divergence must not flake on them.
    divergence = any(g.suspect.tier != flow.WEAK for g in groups)
    receiving = receiving_ranks(groups)
    unmatched = verdict.unmatched_clause(pairs)
    finding = verdict.finding(divergence, suspects, len(groups), receiving, pairs, working)
    return Diagnosis(
        divergence=divergence, mostly_unmatched=unmatched is not None,
        verdict=verdict.join(unmatched, finding), unmatched=unmatched, finding=finding,
        mode=modes[0] if len(modes) == 1 else modes,
        precision=Precision(working, working_u, inferred),
        suspects=suspects, suspect_count=len(groups), receiving_ranks=receiving, pairs=pairs,
        thresholds={"noise_floor": dict(DTYPE_NOISE_FLOOR), "rounding_units": ROUNDING_UNITS,
                    "amplification": AMPLIFICATION, "introduced_ratio": INTRODUCED_RATIO,
                    "working_precision_share": WORKING_PRECISION_SHARE, "min_matched_share": MIN_MATCHED_SHARE})


def _typed(result):
    """A result with typed rows: one from compare_dumps as it is; anything else with a `table` (a CSV
    read with pandas, msProbe's or ours) read back through compare's table reader."""
    if getattr(result, "rows", None) is not None or getattr(result, "mode", None) == "structure":
        return result
    from msprobe.core.compare.table_reader import result_from_table
    return result_from_table(result.table, getattr(result, "mode", None), getattr(result, "step", 0) or 0,
                             getattr(result, "rank", 0) or 0, bool(getattr(result, "is_proc", False)))

"""Compare two grad_probe runs: per step and parameter, how many gradient signs agree.

Similarity of a parameter at a step is the share of elements whose "gradient > 0" bit is the same in
both runs; the step's total weighs parameters by their element counts. Runs diverge at the first step
whose total is below `threshold`, or fell by more than `drop` since the previous step (msProbe's
heuristic: 0.97 and 0.03). `first_different_step` is stricter: the first step where any statistic or
bit differs at all (identical runs have none). Must not import torch or mindspore.
"""

import logging
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from msprobe.core.errors import MsprobeError
from msprobe.core.grad_probe.files import STAT_COLUMNS, find_grad_ranks, load_direction, read_summary, \
    summary_steps

logger = logging.getLogger(__name__)

THRESHOLD = 0.97
DROP = 0.03


def _popcount(a):
    if hasattr(np, "bitwise_count"):
        return int(np.bitwise_count(a).sum())
    return int(np.unpackbits(a).sum())


def sign_similarity(bits_a, bits_b, numel):
    """Share of the `numel` elements whose packed sign bits agree (padding bits are 0 in both)."""
    if numel == 0:
        return 1.0
    return 1.0 - _popcount(np.bitwise_xor(bits_a, bits_b)) / numel


@dataclass
class RankComparison:
    """One rank's comparison.

    Attributes:
        similarity: [step][param] sign agreement in [0, 1]; nan where a bitmap is missing (L0 runs).
        total: per step, element-weighted over parameters with bitmaps.
        param_divergence: param -> first step it diverged (same rule as the total), for those that did.
        only_in_a / only_in_b / shape_mismatch: parameters left out of the comparison.
    """

    rank: int
    steps: List[int]
    params: List[str]
    numels: List[int]
    similarity: np.ndarray
    total: np.ndarray
    first_divergent_step: Optional[int]
    first_different_step: Optional[int]
    param_divergence: Dict[str, int] = field(default_factory=dict)
    only_in_a: List[str] = field(default_factory=list)
    only_in_b: List[str] = field(default_factory=list)
    shape_mismatch: List[str] = field(default_factory=list)

    @property
    def has_directions(self):
        return bool(np.isfinite(self.total).any())

    def worst_params(self, step, n=5):
        """The `n` parameters least similar at `step`: [(name, similarity)]."""
        i = self.steps.index(step)
        row = self.similarity[i]
        order = [j for j in np.argsort(row, kind="stable") if np.isfinite(row[j])][:n]
        return [(self.params[j], float(row[j])) for j in order]


def first_divergence(series, threshold=THRESHOLD, drop=DROP):
    """Index of the first value below `threshold` or more than `drop` below its predecessor; else None."""
    prev = None
    for i, v in enumerate(series):
        if not math.isfinite(v):
            continue
        if v < threshold or (prev is not None and prev - v > drop):
            return i
        prev = v
    return None


def _differs(row_a, row_b):
    for col in STAT_COLUMNS + ("MD5",):
        va, vb = row_a.get(col), row_b.get(col)
        if isinstance(va, float) and isinstance(vb, float):
            if not (va == vb or (math.isnan(va) and math.isnan(vb))):
                return True
        elif va != vb:
            return True
    return False


def compare_rank(rank, path_a, path_b, threshold=THRESHOLD, drop=DROP):
    steps = sorted(set(summary_steps(path_a)) & set(summary_steps(path_b)))
    if not steps:
        raise MsprobeError(f"rank {rank}: no step recorded in both runs ({path_a}: {summary_steps(path_a)}, "
                           f"{path_b}: {summary_steps(path_b)})")
    summaries_a = {s: read_summary(path_a, s) for s in steps}
    summaries_b = {s: read_summary(path_b, s) for s in steps}
    first_a, first_b = summaries_a[steps[0]], summaries_b[steps[0]]
    only_a = [p for p in first_a if p not in first_b]
    only_b = [p for p in first_b if p not in first_a]
    mismatch = [p for p in first_a if p in first_b and first_a[p]["Shape"] != first_b[p]["Shape"]]
    params = [p for p in first_a if p in first_b and p not in mismatch]
    if not params:
        raise MsprobeError(f"rank {rank}: the runs share no parameter of the same shape "
                           f"(a: {', '.join(list(first_a)[:5])}; b: {', '.join(list(first_b)[:5])})")
    numels = [int(np.prod(first_a[p]["Shape"], dtype=np.int64)) for p in params]
    sim = np.full((len(steps), len(params)), np.nan)
    first_diff = None
    for i, s in enumerate(steps):
        sa, sb = summaries_a[s], summaries_b[s]
        for j, (p, n) in enumerate(zip(params, numels)):
            if p not in sa or p not in sb:
                continue
            if first_diff is None and _differs(sa[p], sb[p]):
                first_diff = s
            ba, bb = load_direction(path_a, s, p, n), load_direction(path_b, s, p, n)
            if ba is not None and bb is not None:
                sim[i, j] = sign_similarity(ba, bb, n)
                if first_diff is None and sim[i, j] < 1.0:
                    first_diff = s
    weights = np.asarray(numels, dtype=np.float64)
    have = np.isfinite(sim)
    with np.errstate(invalid="ignore", divide="ignore"):
        total = np.where(have, sim, 0.0) @ weights / (have @ weights)
    div = first_divergence(total, threshold, drop)
    per_param = {}
    for j, p in enumerate(params):
        k = first_divergence(sim[:, j], threshold, drop)
        if k is not None:
            per_param[p] = steps[k]
    return RankComparison(rank, steps, params, numels, sim, total, steps[div] if div is not None else None,
                          first_diff, per_param, only_a, only_b, mismatch)


def compare_grad_runs(dir_a, dir_b, threshold=THRESHOLD, drop=DROP):
    """Compare two grad_probe outputs (dump_path of each run, or one rank dir of each).

    Returns:
        list[RankComparison], one per rank present in both.

    Raises:
        DumpFormatError: a directory holds no grad_probe output; MsprobeError: nothing in common, or
        `threshold` or `drop` outside [0, 1].
    """
    for name, v in (("--threshold", threshold), ("--drop", drop)):  # named as grad_compare's options
        if not 0.0 <= v <= 1.0:
            raise MsprobeError(f"{name}: got {v}; allowed: a number in [0, 1]")
    ranks_a, ranks_b = find_grad_ranks(dir_a), find_grad_ranks(dir_b)
    if len(ranks_a) == 1 and len(ranks_b) == 1:
        pairs = [(next(iter(ranks_a)), next(iter(ranks_a.values())), next(iter(ranks_b.values())))]
    else:
        common = sorted(set(ranks_a) & set(ranks_b))
        if not common:
            raise MsprobeError(f"no rank in both runs: {dir_a} has {sorted(ranks_a)}, {dir_b} has {sorted(ranks_b)}")
        pairs = [(r, ranks_a[r], ranks_b[r]) for r in common]
    return [compare_rank(r, a, b, threshold, drop) for r, a, b in pairs]

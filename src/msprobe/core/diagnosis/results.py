"""The typed results of a diagnosis: `Diagnosis` (one compare), `PairDiagnosis` (one step and rank, its
labels held as an array beside the typed rows) and `Suspect` (a listed call, with its `Evidence`).

Every output is rendered from these by its own writer: diagnosis.json (`diagnosis_json.py`), the
printout (`report.py`), the Diagnosis column (`labels.py`), the graph's badges (`core/graph`).
A `Diagnosis` also reads as diagnosis.json's mapping (`d["verdict"]`) for callers that took it as one.
Must not import torch or mindspore.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class Evidence:
    """One input or output row of a listed suspect, as diagnosis.json shows it."""

    name: str
    diagnosis: str               # the row's label
    error: float
    noise_floor: float
    diverges: bool
    flags: list
    target_dtype: str
    golden_dtype: str
    target: dict                 # {"max", "min", "mean", "norm"}
    golden: dict
    tensor_metrics: dict | None = None  # tensor mode: msProbe's metric name -> value
    origin: str | None = None    # where a differing input's value came from


@dataclass
class Suspect:
    """A call where error is introduced, over all steps and ranks it was suspected on."""

    api: str
    kind: str
    tier: str                    # strong, amplifying, weak or communication
    direction: str
    step: int                    # of its evidence: the earliest step, lowest rank
    steps: list
    rank: int
    ranks: list
    is_proc: bool
    module: str | None
    module_path: list
    reason: str
    input_error: float
    output_error: float
    amplification: float
    stack: str | None
    inputs: list                 # Evidence
    outputs: list
    also_explains: list          # modules whose error this call explains


@dataclass(eq=False)
class PairDiagnosis:
    """One step and rank: its counts and notes (diagnosis.json's `ranks` entry), its row labels and the
    per-call suspects (`flow.CallSuspect`) that `combine` ranks over all pairs."""

    step: int
    rank: int
    mode: str
    is_proc: bool
    rows: int                    # target values that count towards "mostly unmatched"
    matched_rows: int
    merge_note: str | None = None
    compared_rows: int = 0
    diverging_rows: int = 0
    diverging_calls: int = 0
    propagating_calls: int = 0
    first_divergence: str | None = None
    unmatched_calls: int = 0
    label_counts: dict = field(default_factory=dict)   # label -> rows, the labels present only
    max_error: float | None = None  # the noise level; None for a structure dump
    cancelled_rows: int | None = None
    structure: dict | None = None   # what one side has and the other lacks
    note: str | None = None
    unmatched_examples: list | None = None
    labels: object = None        # numpy object array: the Diagnosis column, one label per table row
    suspects: list = field(default_factory=list)
    context: dict = field(default_factory=dict)  # suspect key -> (enclosing modules, stack lines)
    pair_index: int | None = None  # its place in a streamed compare (rank_pairs), to read it again


@dataclass
class Precision:
    working: str | None
    unit_roundoff: float
    inferred: bool


@dataclass(eq=False)  # equal when diagnosis.json would be (Mapping's equality)
class Diagnosis(Mapping):
    """Where error is introduced in one compare (all its steps and ranks).

    Attributes:
        divergence: a suspect beyond marginal: --fail-on-divergence fails.
        mostly_unmatched: most target values have no golden counterpart.
        verdict: the one-sentence account: `unmatched`, then `finding` (`verdict.join`).
        unmatched: the clause saying most target values have no golden counterpart, or None.
        finding: what the verdict says of the values, without that clause.
        mode: the compare mode, or the sorted modes when pairs differ.
        precision: the working precision the target may round to.
        suspects: the listed Suspects, most likely first (at most thresholds.MAX_SUSPECTS).
        suspect_count: suspects found in all.
        receiving_ranks: ranks that only receive the error from other ranks.
        pairs: PairDiagnosis per step and rank, in (step, rank) order.
        thresholds: the thresholds it was decided with.
        failed_pairs: {"step", "rank", "error"} per pair that could not be compared (write_compare).
    """

    divergence: bool
    mostly_unmatched: bool
    verdict: str
    unmatched: str | None
    finding: str
    mode: object
    precision: Precision
    suspects: list
    suspect_count: int
    receiving_ranks: list
    pairs: list
    thresholds: dict
    failed_pairs: list | None = None

    def pair(self, step, rank):
        """The PairDiagnosis of a step and rank, or None."""
        return next((p for p in self.pairs if p.step == (step or 0) and p.rank == (rank or 0)), None)

    def to_json(self):
        """diagnosis.json's content."""
        from msprobe.core.diagnosis.diagnosis_json import diagnosis_json
        return diagnosis_json(self)

    @classmethod
    def from_json(cls, doc):
        """The Diagnosis a diagnosis.json holds (its pairs without their suspects' calls)."""
        from msprobe.core.diagnosis.diagnosis_json import diagnosis_from_json
        return diagnosis_from_json(doc)

    # read as diagnosis.json's mapping
    def _json(self):
        return self.to_json()

    def __getitem__(self, key):
        return self._json()[key]

    def __iter__(self):
        return iter(self._json())

    def __len__(self):
        return len(self._json())

"""Diagnosis after a compare: where error is *introduced*, beyond what precision explains.

A peer of `compare/` and `overflow/`: it reads the typed rows compare builds (`CompareResult.rows`),
never the display table. `diagnose(results)` returns a typed `Diagnosis` (results.py) and adds the
Diagnosis column to each result's table; its writers render it: `Diagnosis.to_json()` (diagnosis.json)
and `format_diagnosis(d)` (a terminal). Importing this package imports neither pandas nor any framework.
"""

from msprobe.core.diagnosis.combine import diagnose
from msprobe.core.diagnosis.report import format_diagnosis
from msprobe.core.diagnosis.results import Diagnosis, Evidence, PairDiagnosis, Suspect

__all__ = ["Diagnosis", "Evidence", "PairDiagnosis", "Suspect", "diagnose", "format_diagnosis"]

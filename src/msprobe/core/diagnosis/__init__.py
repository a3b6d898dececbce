"""Diagnosis after a compare: where error is *introduced*, beyond what precision explains.

A peer of `compare/` and `overflow/`: it reads the typed rows compare builds (`CompareResult.rows`),
never the display table. `diagnose(results)` returns diagnosis.json's content and adds the Diagnosis
column to each result's table; `format_diagnosis(d)` renders it for a terminal. Importing this package
imports neither pandas nor any framework.
"""

from msprobe.core.diagnosis.report import format_diagnosis
from msprobe.core.diagnosis.suspects import diagnose

__all__ = ["diagnose", "format_diagnosis"]

"""Comparison of two dumps (`msprobe compare`) and shared tensor metrics (also used by acc_check).

Public entry points: `compare_dumps` (one CompareResult per step/rank pair), `compare` (one pandas
DataFrame) and `write_compare` (what `msprobe compare` does: compare, diagnose, write the files).
Importing this package imports neither pandas nor any framework.
"""

from msprobe.core.compare.engine import CompareResult, compare, compare_dumps
from msprobe.core.compare.outputs import CompareOutputs, write_compare

__all__ = ["CompareOutputs", "CompareResult", "compare", "compare_dumps", "write_compare"]

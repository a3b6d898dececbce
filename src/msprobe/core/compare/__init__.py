"""Comparison of two dumps (`msprobe compare`) and shared tensor metrics (also used by acc_check).

Public entry points: `compare_dumps` (one CompareResult per step/rank pair) and `compare` (one
pandas DataFrame). Importing this package imports neither pandas nor any framework.
"""

from msprobe.core.compare.engine import CompareResult, compare, compare_dumps

__all__ = ["CompareResult", "compare", "compare_dumps"]

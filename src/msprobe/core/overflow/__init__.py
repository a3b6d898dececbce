"""Overflow analysis: find the first node of a dump whose inputs are finite but whose outputs are not.

Framework-neutral (reads dump directories only); must not import torch or mindspore.
"""

from msprobe.core.overflow.analyze import OverflowAnalysis, analyze_overflow

__all__ = ["OverflowAnalysis", "analyze_overflow"]

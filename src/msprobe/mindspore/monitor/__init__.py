"""MindSpore training-state monitor: `TrainerMon` (Cell hooks, optimizer Cell hooks, numpy statistics)."""

from msprobe.mindspore.monitor.trainer_mon import TrainerMon

__all__ = ["TrainerMon"]

"""PyTorch training-state monitor: `TrainerMon` (hooks, batched on-device statistics)."""

from msprobe.pytorch.monitor.trainer_mon import TrainerMon

__all__ = ["TrainerMon"]

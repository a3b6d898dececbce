"""Gradient monitoring for PyTorch: per-step, per-parameter gradient statistics and sign bitmaps."""

from msprobe.pytorch.grad_probe.monitor import GradientMonitor

__all__ = ["GradientMonitor"]

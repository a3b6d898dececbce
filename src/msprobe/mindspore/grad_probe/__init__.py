"""Gradient monitoring for MindSpore (PyNative): per-step, per-parameter gradient statistics and sign
bitmaps, read from the gradients an optimizer Cell is called with."""

from msprobe.mindspore.grad_probe.monitor import GradientMonitor

__all__ = ["GradientMonitor"]

"""Gradient monitoring (grad_probe): configuration, output files, writer and the run-to-run comparison.

Framework-neutral; the PyTorch and MindSpore monitors live in `msprobe.{pytorch,mindspore}.grad_probe`.
Must not import torch or mindspore.
"""

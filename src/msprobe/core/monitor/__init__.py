"""Training-state monitor, framework-neutral part: config, statistics ops, alert rules, writers, report.

The adapters (`msprobe.pytorch.monitor`, `msprobe.mindspore.monitor`) reduce tensors to rows of
numbers; everything after that (files, alerts, charts) lives here. Must not import torch or mindspore.
"""

"""Framework-neutral core: config, naming, dump format (writer and reader), analyses.

Nothing under `msprobe.core` may import torch or mindspore.
"""

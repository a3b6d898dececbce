"""msprobe: precision debugging for PyTorch and MindSpore training and inference.

The package root imports nothing heavy: framework adapters live in `msprobe.pytorch` and
`msprobe.mindspore` and are imported only by the user.
"""

__version__ = "0.1.0"

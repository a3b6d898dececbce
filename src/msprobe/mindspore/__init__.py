"""MindSpore adapter: `PrecisionDebugger` (dump), `seed_all`, and the `mindspore.train.Model` callbacks
`MsprobeStep` / `MsprobeInitStep`.

Importing this package imports mindspore; `msprobe.core` never does.
"""

from msprobe.mindspore import numpy_compat  # noqa: F401  (must run before any op with a scalar)
from msprobe.mindspore.callbacks import MsprobeInitStep, MsprobeStep
from msprobe.mindspore.debugger import PrecisionDebugger
from msprobe.mindspore.seed import seed_all

__all__ = ["PrecisionDebugger", "seed_all", "MsprobeStep", "MsprobeInitStep", "TrainerMon"]


def __getattr__(name):
    # The monitor is imported on first use, so importing msprobe.mindspore for a dump stays cheap.
    if name == "TrainerMon":
        from msprobe.mindspore.monitor import TrainerMon
        return TrainerMon
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

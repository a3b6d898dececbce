"""PyTorch adapter: `PrecisionDebugger` (dump) and `seed_all` (reproducibility).

Importing this package imports torch; `msprobe.core` never does.
"""

from msprobe.pytorch.debugger import PrecisionDebugger
from msprobe.pytorch.seed import seed_all

__all__ = ["PrecisionDebugger", "seed_all", "TrainerMon"]


def __getattr__(name):
    # The monitor is imported on first use, so importing msprobe.pytorch for a dump stays cheap.
    if name == "TrainerMon":
        from msprobe.pytorch.monitor import TrainerMon
        return TrainerMon
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""PyTorch adapter: `PrecisionDebugger` (dump) and `seed_all` (reproducibility).

Importing this package imports torch; `msprobe.core` never does.
"""

from msprobe.pytorch.debugger import PrecisionDebugger
from msprobe.pytorch.seed import seed_all

__all__ = ["PrecisionDebugger", "seed_all"]

"""Global mutable state of the PyTorch adapter, in one import-free module."""

# The DumpSession that records now, or None. Set by PrecisionDebugger.start/stop/step.
session = None
# True while msprobe's own code runs torch ops (statistics, hooks), so capture ignores them.
# Set by DumpSession around every piece of tool work.
busy = False
# Largest autograd sequence number seen after a captured call; nodes at or below it existed before
# the next call. Set by DumpSession after each API call, read by the backward tracker.
seq_watermark = -1
# >0 while a captured API runs: calls made inside it are not recorded separately.
# Set by DumpSession.record_call.
depth = 0

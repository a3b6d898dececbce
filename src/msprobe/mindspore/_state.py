"""Global mutable state of the MindSpore adapter, in one import-free module."""

# The DumpSession that records now, or None. Set by PrecisionDebugger.start/stop/step.
session = None
# True between start() and stop() (capture on): the API wrappers stay installed across dumped steps
# and record only then (capture/patched_api.py).
recording = False
# The PatchedApis whose wrappers are installed now (one debugger's; another's start() takes them over).
apis_patched_by = None
# True while msprobe's own code runs MindSpore ops (statistics, hooks), so capture ignores them.
busy = False
# ids of the Parameters the running PyNative grad pass differentiates (frozenset), or None: not known
# (capture/patched_api.py, `_grad_call`; see GradTracker's `params_at`)
grad_params = None
# the autograd leaf-node ids of those Parameters (frozenset), or None with grad_params
grad_leaves = None
# >0 while a captured API runs: calls made inside it are not recorded separately.
depth = 0
# A weak reference to the most recently built PrecisionDebugger (MsprobeInitStep sets its first
# step); weak, so that a debugger the user let go of does not keep its network alive.
debugger = None

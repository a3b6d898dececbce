"""GRAPH_MODE dumps (and L2 in PyNative): what MindSpore's CPU build allows.

L0 in a static graph is built on `ops.TensorDump` and L2 on MindSpore's kernel dump; see
`start_static` / `start_kernel_dump` for what works on the CPU build and the one-line message given
where it cannot.
"""

from msprobe.core.errors import MsprobeError


class StaticGraphUnsupported(MsprobeError):
    """A static-graph feature MindSpore's CPU build cannot provide."""


def start_static(cfg, model, step):
    raise StaticGraphUnsupported(
        f"level {cfg.level} in GRAPH_MODE is not available on MindSpore's CPU build")


def start_kernel_dump(cfg, step):
    raise StaticGraphUnsupported("level L2 (kernel dump) is not available on MindSpore's CPU build")

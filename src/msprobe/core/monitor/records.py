"""One recorded row of the monitor (a tensor reduced to its ops) and how rows are named.

Tags are msProbe's data types: `actv`, `actv_grad` (per micro step), `grad_unreduced`, `grad_reduced`,
`param_origin`, `param_updated`, and one per optimizer state (`exp_avg`, `exp_avg_sq`,
`momentum_buffer`, ...). Must not import torch or mindspore.
"""

from dataclasses import dataclass
from typing import List, Optional, Tuple

# Tags whose rows carry a micro_step (one row per forward/backward call within a step).
MICRO_STEP_TAGS = ("actv", "actv_grad")


@dataclass
class MetricRow:
    """The ops of one tensor at one step.

    Attributes:
        tag: data type (`actv`, `grad_reduced`, ...).
        name: module I/O (`blocks.0.fc1.output`) or parameter name (`blocks.0.fc1.weight`).
        step: training step (optimizer steps since `start_iteration`).
        micro_step: call index within the step for activations, else None.
        values: one float per config op, in the config's order.
        shape, dtype: of the tensor, as the framework prints them.
        vpp_stage: virtual pipeline stage (0 without pipeline parallelism).
    """

    tag: str
    name: str
    step: int
    micro_step: Optional[int]
    values: List[float]
    shape: Tuple[int, ...]
    dtype: str
    vpp_stage: int = 0

    def tb_tag(self, rank):
        """TensorBoard tag prefix, msProbe's layout: `{vpp}:{name}[:{micro}]/rank{r}/{tag}`."""
        micro = f":{self.micro_step}" if self.micro_step is not None else ""
        return f"{self.vpp_stage}:{self.name}{micro}/rank{rank}/{self.tag}"

"""Activation checkpointing: is the forward code running now a recomputation inside backward?

`torch.utils.checkpoint` (reentrant or not, and Hugging Face's `gradient_checkpointing_enable()`) runs
a checkpointed region's forward a second time during backward. Those calls are not new forward calls:
capture lets them run unrecorded, so they neither add records nor shift the call numbering. A
non-reentrant checkpoint keeps the first forward's autograd graph, so its backward records come as
without checkpointing; a reentrant one ran its first forward under no_grad, so the region's calls
have forward records and no backward records.
Checked only while autograd's engine runs (one C call otherwise).
"""

import os
import sys

import torch

graph_task_id = torch._C._current_graph_task_id  # -1 outside a backward pass
# the file's path, not the module: importing torch.utils.checkpoint pulls sympy into every dump
_CHECKPOINT_FILE = os.path.join(os.path.dirname(torch.utils.__file__), "checkpoint.py")
# the functions of torch/utils/checkpoint.py that run a region's forward again
_RECOMPUTERS = frozenset({"backward", "unpack_hook", "unpack_hook_with_error_cb", "recompute_fn"})


def recomputing():
    """True inside a checkpointed region's recomputation (in backward)."""
    if graph_task_id() == -1:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_filename == _CHECKPOINT_FILE and code.co_name in _RECOMPUTERS:
            return True
        frame = frame.f_back
    return False

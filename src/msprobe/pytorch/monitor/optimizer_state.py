"""Finding the torch optimizer inside a training library's wrapper, and its per-parameter moments.

Wrappers of Megatron, DeepSpeed, Accelerate, Lightning and Transformers keep the real optimizer in
`.optimizer` (sometimes several levels deep); the monitor hooks that one. Moments are the optimizer's
per-parameter state tensors shaped like the parameter: `exp_avg`/`exp_avg_sq` (Adam, AdamW),
`max_exp_avg_sq` (amsgrad), `momentum_buffer` (SGD with momentum), `square_avg` (RMSprop), ...
"""

import torch

from msprobe.core.monitor import trainer


def unwrap_optimizer(optimizer):
    """The innermost `torch.optim.Optimizer` reached through `.optimizer` attributes (core's unwrap_optimizer)."""
    return trainer.unwrap_optimizer(optimizer, torch.optim.Optimizer, "torch.optim.Optimizer", "torch")


def moment_tensors(optimizer, params):
    """{state key: ([param index], [tensor])} for the state tensors shaped like their parameter."""
    out = {}
    for i, p in enumerate(params):
        for key, value in optimizer.state.get(p, {}).items():
            if key != "step" and isinstance(value, torch.Tensor) and value.shape == p.shape:
                idxs, tensors = out.setdefault(key, ([], []))
                idxs.append(i)
                tensors.append(value)
    return out

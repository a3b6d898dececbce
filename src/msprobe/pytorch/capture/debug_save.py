"""Single-point save (level debug): PyTorch's side of core/dump/debug_save.py. A gradient is copied as it
arrives: autograd may add the next one into the same tensor in place."""

import torch

from msprobe.core.dump import debug_save
from msprobe.pytorch.tool_work import tool_work

_OPS = debug_save.SaveOps(torch.Tensor, hooked=lambda t: t.requires_grad, kept=lambda g: g.detach().clone(),
                          recording=torch.is_grad_enabled, work=tool_work)


def save_variable(session, variable, name, count, save_backward):
    debug_save.save_variable(session, variable, name, count, save_backward, _OPS)

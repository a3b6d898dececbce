"""overflow_check task: which values overflowed, and how many overflowing records may still be written.

A value overflows when it holds inf or nan, or — for float16/bfloat16, whose hardware may saturate
instead of producing inf — when it reaches the dtype's largest finite magnitude (|x| == finfo.max).
Forward calls are checked on their live output tensors (one aminmax each); backward records, whose
gradients are summarised as they arrive, are checked on the statistics already computed.
"""

import math

import torch

from msprobe.core.dump.overflow import record_overflows as core_record_overflows

_SATURATING = {torch.float16: torch.finfo(torch.float16).max, torch.bfloat16: torch.finfo(torch.bfloat16).max}
_SATURATING_NAMES = {str(k): v for k, v in _SATURATING.items()}


def tensor_overflows(t):
    """Does tensor `t` hold inf/nan, or (fp16/bf16) a value at the dtype's limit?"""
    if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.layout is not torch.strided:
        return False
    if t.is_complex():
        t = t.abs()
    if not t.is_floating_point():
        return False
    with torch.no_grad():
        x = t.detach()
        if x.dtype.itemsize == 1:
            x = x.float()
        mn, mx = torch.aminmax(x)
        lo, hi = mn.item(), mx.item()
    limit = _SATURATING.get(t.dtype)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return True
    return limit is not None and max(abs(lo), abs(hi)) >= limit


def record_overflows(value):
    """Does any tensor record in `value` (a record or a list of them) show an overflow in Max/Min?"""
    return core_record_overflows(value, _SATURATING_NAMES)

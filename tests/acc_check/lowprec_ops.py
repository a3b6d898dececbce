"""Custom APIs for the acc_check tests: a matmul with a planted precision defect and its correct twin.

`matmul_fp16_inside` is what a bad kernel does: given float32 it multiplies in float16 and casts back;
given float64 (the benchmark) it is exact, so acc_check sees the defect. `matmul_exact` is the same
API done right. `slow_add` is a correct add that takes a while (to SIGKILL a run mid-way).
"""

import time

import torch


def matmul_fp16_inside(a, b):
    if a.dtype == torch.float32:
        return torch.matmul(a.half(), b.half()).float()
    return torch.matmul(a, b)


def matmul_exact(a, b):
    return torch.matmul(a, b)


def slow_add(a, b):
    time.sleep(0.25)
    return a + b

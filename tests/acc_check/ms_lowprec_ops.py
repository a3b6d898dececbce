"""MindSpore custom APIs for the acc_check tests: a matmul with a planted precision defect (float32
multiplied in float16) and its correct twin."""

import mindspore as ms
from mindspore import mint


def matmul_fp16_inside(a, b):
    if a.dtype == ms.float32:
        return mint.matmul(a.astype(ms.float16), b.astype(ms.float16)).astype(ms.float32)
    return mint.matmul(a, b)


def matmul_exact(a, b):
    return mint.matmul(a, b)

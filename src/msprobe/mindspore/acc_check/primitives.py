"""Primitives rebuilt for acc_check from the constructor arguments the dump recorded
(`api_sources.json`, see capture/primitive_attrs.py), and their float64 benchmark.

Most primitives run in float64 on MindSpore's CPU kernels as they are (MatMul, BiasAdd, MaxPool,
AvgPool, ReLU, GeLU, Sigmoid, Tanh, Softmax, ...). Two that a CNN cannot do without have no float64
kernel: Conv2D and BatchNorm. Their benchmark is the same computation written with ops that do have
one (an im2col convolution of gathers and one matmul; normalisation from batch or running
statistics), so forward and backward are compared against float64 as for every other API.
BatchNorm's benchmark gives its normalised output only: the other outputs (batch statistics, saved
buffers) differ between MindSpore's CPU and Ascend kernels (on the CPU two of them are left unwritten).
"""

import numpy as np

import mindspore as ms
from mindspore import ops


def _pair(value):
    """An int, or a tuple of 2 or 4 (N, C, H, W) -> (h, w)."""
    if isinstance(value, int):
        return value, value
    return tuple(value[-2:])


def _conv_padding(mode, pad, size, kernel, stride, dilation):
    """(before, after) padding of one spatial axis, as MindSpore's Conv2D pads."""
    mode = mode.lower()
    if mode == "valid":
        return 0, 0
    if mode == "same":
        out = -(-size // stride)
        total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
        return total // 2, total - total // 2
    return pad


def conv2d_float64(attrs):
    """Conv2D(out_channel, kernel_size, mode, pad_mode, pad, stride, dilation, group, data_format) in
    float64: gathers of the padded input per kernel offset, stacked, then one batched matmul."""
    kh, kw = _pair(attrs["kernel_size"])
    sh, sw = _pair(attrs.get("stride", 1))
    dh, dw = _pair(attrs.get("dilation", 1))
    group = attrs.get("group", 1)
    mode = attrs.get("pad_mode", "valid")
    pad = attrs.get("pad", 0)
    pads = (pad,) * 4 if isinstance(pad, int) else tuple(pad)   # top, bottom, left, right
    if attrs.get("data_format", "NCHW") != "NCHW":
        raise ValueError(f"data_format {attrs['data_format']!r} (the float64 benchmark is NCHW only)")

    def conv2d(x, w):
        n, c, h, wd = x.shape
        top, bottom = _conv_padding(mode, pads[:2], h, kh, sh, dh)
        left, right = _conv_padding(mode, pads[2:], wd, kw, sw, dw)
        x = ops.pad(x, (left, right, top, bottom))
        oh = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
        ow = (wd + left + right - dw * (kw - 1) - 1) // sw + 1
        taps = []
        for i in range(kh):
            rows = ops.gather(x, ms.Tensor(np.arange(oh) * sh + i * dh, ms.int32), 2)
            for j in range(kw):
                taps.append(ops.gather(rows, ms.Tensor(np.arange(ow) * sw + j * dw, ms.int32), 3))
        patches = ops.stack(taps, 2).reshape(n, group, c // group * kh * kw, oh * ow)
        o = w.shape[0]
        y = ops.matmul(w.reshape(group, o // group, c // group * kh * kw), patches)
        return y.reshape(n, o, oh, ow)
    return conv2d


def batch_norm_float64(attrs):
    """BatchNorm(is_training, epsilon, momentum, data_format)(x, scale, bias, mean, variance) in float64:
    the normalised output, from the batch's statistics in training, else from `mean` and `variance`."""
    training = attrs.get("is_training", False)
    eps = attrs.get("epsilon", 1e-5)
    channel = -1 if attrs.get("data_format", "NCHW") == "NHWC" else 1

    def batch_norm(x, scale, bias, mean, variance):
        axis = channel % x.ndim
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        if training:
            axes = tuple(a for a in range(x.ndim) if a != axis)
            mean = x.mean(axis=axes, keep_dims=True)
            variance = ((x - mean) ** 2).mean(axis=axes, keep_dims=True)
        else:
            mean, variance = mean.reshape(shape), variance.reshape(shape)
        return (x - mean) / ops.sqrt(variance + eps) * scale.reshape(shape) + bias.reshape(shape)
    return batch_norm


# primitive class name -> (benchmark builder from the constructor arguments, outputs compared)
FLOAT64_BENCHMARKS = {
    "Conv2D": (conv2d_float64, None),
    "BatchNorm": (batch_norm_float64, (0,)),
}


class RebuiltPrimitive:
    """A Primitive rebuilt from its recorded arguments: called, it is the primitive (the tested run);
    `bench` is what the float64 run calls and `compared_outputs` which of the tested outputs it gives
    (None: all)."""

    def __init__(self, prim):
        self.prim = prim
        self.bench, self.compared_outputs = prim, None
        entry = FLOAT64_BENCHMARKS.get(type(prim).__name__)
        if entry is not None:
            build, self.compared_outputs = entry
            self.bench = build(dict(prim.init_attrs))

    def __call__(self, *args, **kwargs):
        return self.prim(*args, **kwargs)

"""Tolerances and op tables of the diagnosis. Data only: no logic, no imports.

Errors are relative and scale-free (see `errors.row_errors`): 0 means identical, 1e-3 means "off by a
thousandth of the tensor's range or norm".
"""

# Below these relative errors two tensors of this dtype count as the same value: the rounding and
# reduction-order noise two correct runs (different kernels or devices) show at that precision.
DTYPE_NOISE_FLOOR = {
    "float64": 1e-10,
    "float32": 1e-5,
    "float16": 2e-3,
    "bfloat16": 1.6e-2,
    "float8_e4m3fn": 1.3e-1,
    "float8_e5m2": 2.5e-1,
}
# MindSpore against PyTorch: other kernels (reduction order, fused against separate ops) on both sides;
# a float32 weight gradient of identical twins differs by up to 4e-5 on CPU (MindSpore 2.10, torch 2.13)
CROSS_FRAMEWORK_NOISE = 10.0
INTEGER_NOISE_FLOOR = 0.0        # integer and bool tensors must match exactly (by value, any width)
UNKNOWN_DTYPE_NOISE_FLOOR = 1e-5

# Unit roundoff (half the distance from 1 to the next number) of each floating dtype: what rounding one
# value to it may change, relatively.
UNIT_ROUNDOFF = {
    "float64": 2.0 ** -53,
    "float32": 2.0 ** -24,
    "tf32": 2.0 ** -11,           # not a dtype: the matmul precision of some accelerators (--precision)
    "float16": 2.0 ** -11,
    "bfloat16": 2.0 ** -8,
    "float8_e4m3fn": 2.0 ** -4,
    "float8_e5m2": 2.0 ** -3,
}
# The run's working precision: the coarsest float dtype the target uses where golden has a finer one,
# on at least this share of the compared float tensors (autocast puts most of a model there; one
# planted cast touches a handful of rows).
WORKING_PRECISION_SHARE = 0.1
# A call may round its inputs and its outputs to the working precision: this many unit roundoffs.
ROUNDING_UNITS = 2.0

# How much a call may grow the relative error its inputs carry. Casts, views and copies cannot grow it;
# exp-like ops grow it with their input's range (d exp(x) / exp(x) = dx); others up to AMPLIFICATION.
# A backward also reads what its forward saved: the larger of the two errors is what it carries. (In the
# models we measured a correct backward stayed within 9x of that error, a 1.5x-wrong formula was 58x.)
AMPLIFICATION = 10.0
RANGE_AMPLIFICATION = 2.0        # exp-like ops: AMPLIFICATION + this x the input's range
# A call's output error beyond this many times what its inputs and rounding explain introduces error
# (a divergence); between 1x and this it is listed as marginal.
INTRODUCED_RATIO = 3.0
# An unexplained input or a flagless output counts as strong when at least this many times its floor.
STRONG_OVER_FLOOR = 10.0

# Calls whose outputs are their inputs rearranged, copied or cast (API names without the prefix).
VALUE_PRESERVING_APIS = frozenset({
    "to", "type", "type_as", "float", "half", "bfloat16", "double", "contiguous", "clone", "detach",
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "permute", "transpose", "t",
    "expand", "expand_as", "repeat", "squeeze", "unsqueeze", "__getitem__", "narrow", "select", "chunk",
    "split", "unbind", "cat", "concat", "stack", "cpu", "cuda", "npu", "copy_", "movedim", "swapaxes",
    "identity", "broadcast_to", "tile", "index_select", "gather", "roll", "flip", "masked_select",
    "Cast", "Reshape", "Transpose", "ExpandDims", "Squeeze", "Concat",
})
# Value-preserving calls whose outputs are pieces of an input (by API name; a backward takes its
# forward's name): slices and splits forward, and the backward of a concatenation, which splits the
# gradient it is given. A piece's size (range, norm) may be smaller than the whole's, and its
# statistics read elements the whole's four statistics may never have seen.
PIECE_APIS = frozenset({"__getitem__", "narrow", "select", "chunk", "split", "unbind", "index_select", "gather",
                        "masked_select"})
PIECE_BACKWARD_APIS = frozenset({"cat", "concat", "stack", "Concat"})
# Casts: their output is their input rounded to another dtype, so in the target itself the two may differ
# by that dtype's rounding only (capped at the working precision: a cast below it introduces error).
CAST_APIS = frozenset({"to", "type", "type_as", "float", "half", "bfloat16", "double", "Cast"})
# the op of an Optimizer.{Class}.{parameter} record (core/dump/optimizer_updates.py)
OPTIMIZER_UPDATE = "optimizer_update"
# Calls whose outputs are sums of their inputs (same units): an output far smaller than its inputs has
# cancelled, and holds little but their rounding.
ADDITIVE_APIS = frozenset({
    "add", "sub", "__add__", "__sub__", "__radd__", "__rsub__", "__iadd__", "__isub__", "add_", "sub_",
    "sum", "mean", "cumsum", "subtract", "Add", "Sub", "ReduceSum", "ReduceMean",
    OPTIMIZER_UPDATE,  # the parameter plus a step made of its gradient
})
# Calls whose relative output error grows with their input's magnitude.
RANGE_APIS = frozenset({
    "exp", "exp2", "expm1", "softmax", "log_softmax", "logsumexp", "sigmoid", "tanh", "silu", "gelu",
    "softplus", "mish", "elu", "selu", "celu", "cross_entropy", "nll_loss", "kl_div", "pow", "__pow__",
    "scaled_dot_product_attention", "Softmax", "Exp",
})
# Calls whose output switches branch at a threshold (relu's zero, a max-pool's winner): an input off by
# rounding puts single elements on the other side, so an element-wise maximum error can reach the
# tensor's full scale while the tensor as a whole (its L2 error) carries only its input's error.
THRESHOLD_APIS = frozenset({
    "relu", "relu_", "relu6", "leaky_relu", "hardtanh", "threshold", "hardswish", "hardsigmoid", "clamp",
    "clamp_", "clip", "maximum", "minimum", "max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool1d",
    "adaptive_max_pool2d", "adaptive_max_pool3d", "dropout", "ReLU", "MaxPool2d",
})
# Recurrent ops: one call runs every time step, rounding at each; autocast runs them at the working
# precision and hands back float32, so their rows show no coarser dtype.
RECURRENT_APIS = frozenset({"gru", "lstm", "rnn_tanh", "rnn_relu", "GRU", "LSTM", "RNN", "DynamicGRUV2",
                            "DynamicRNN"})
# Argument slots of common APIs that hold parameters (weights read directly at level L1, where no
# module record names them): base API name -> {position or keyword: parameter name}.
_WEIGHT_BIAS = {"1": "weight", "2": "bias", "weight": "weight", "bias": "bias"}
PARAMETER_SLOTS = {
    "linear": _WEIGHT_BIAS, "dense": _WEIGHT_BIAS, "bilinear": {"2": "weight", "3": "bias"},
    "conv1d": _WEIGHT_BIAS, "conv2d": _WEIGHT_BIAS, "conv3d": _WEIGHT_BIAS,
    "conv_transpose1d": _WEIGHT_BIAS, "conv_transpose2d": _WEIGHT_BIAS, "conv_transpose3d": _WEIGHT_BIAS,
    "embedding": {"1": "weight", "weight": "weight"},
    "layer_norm": {"2": "weight", "3": "bias", "weight": "weight", "bias": "bias"},
    "group_norm": {"2": "weight", "3": "bias", "weight": "weight", "bias": "bias"},
    "batch_norm": {"3": "weight", "4": "bias", "weight": "weight", "bias": "bias"},
    "rms_norm": {"2": "weight", "weight": "weight"},
    # the Primitives MindSpore's standard Cells call (nn.Dense: MatMul then BiasAdd; nn.Embedding: Gather)
    "MatMul": {"1": "weight"}, "Conv2D": {"1": "weight"}, "BiasAdd": {"1": "bias"},
    "LayerNorm": {"1": "weight", "2": "bias"}, "BatchNorm": {"1": "weight", "2": "bias"},
    "Gather": {"0": "weight"},
}

# Collectives move values between ranks: their output may differ because another rank diverged.
COMMUNICATION_PREFIXES = ("Distributed.",)

# Evidence kept per suspect (rows of inputs and outputs, most divergent first) and suspects kept.
EVIDENCE_ROWS = 6
MAX_SUSPECTS = 20
# A compare where fewer of the target's rows than this share have a golden partner is reported as
# "the two dumps mostly do not match" before anything else, and fails --fail-on-divergence.
MIN_MATCHED_SHARE = 0.5

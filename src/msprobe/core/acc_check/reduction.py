"""How many terms are summed into one output element: the reduction length K of an API call.

The dtype-aware verdict allows rounding error that grows with sqrt(K). K is estimated from the API's
name and the shapes of its tensors, erring on the large side where the name does not say:

- matmul family: the contracted dimension; convolutions: the weight's elements per output channel;
- other APIs: how many input elements there are per output element (sum, mean, norms ...), and at
  least the largest input dimension for shape-keeping reductions (softmax, layer_norm, cumsum ...);
- backward: gradients of a broadcast input sum over the broadcast dimensions; gradients of a
  contraction sum over the other operand's rows (e.g. a linear weight's gradient sums over the batch).

Must not import torch or mindspore.
"""

import math

# API names (without prefix) that contract a dimension like a matrix product; value: which tensor
# argument's last dimension is contracted.
MATMUL_LIKE = {
    "matmul": 0, "mm": 0, "bmm": 0, "linear": 0, "mv": 0, "dot": 0, "vdot": 0, "inner": 0, "__matmul__": 0,
    "__rmatmul__": 1, "addmm": 1, "addmm_": 1, "baddbmm": 1, "baddbmm_": 1, "addbmm": 1, "addbmm_": 1,
    "addmv": 1, "addmv_": 1, "bilinear": 0, "chain_matmul": 0, "multi_dot": 0, "linalg_multi_dot": 0,
    "batch_matmul": 0, "dense": 0, "einsum": None, "tensordot": None, "kron": None,
}
# Shape-keeping APIs that still reduce along a dimension.
REDUCING_WORDS = ("softmax", "norm", "logsumexp", "cumsum", "cumprod", "var", "std", "attention",
                  "normalize", "logcumsumexp", "cross_entropy", "nll_loss", "glu")


def _contracted(name, shapes):
    which = MATMUL_LIKE[name]
    dims = [s for s in shapes if len(s) >= 1]
    if which is None or which >= len(dims):
        return max((max(s) for s in dims), default=1)
    return dims[which][-1]


def forward_reduction_length(api, input_shapes, output_shape):
    """K for one forward output.

    Args:
        api: the API name without prefix (`linear`, `softmax`, `add.Tensor` for aten).
        input_shapes: shapes of the tensor arguments in order.
        output_shape: shape of the output element judged.
    """
    name = api.split(".", 1)[0].lower()
    shapes = [tuple(s) for s in input_shapes]
    if not shapes:
        return 1
    if name in MATMUL_LIKE:
        return max(1, _contracted(name, shapes))
    if name.startswith("conv") and len(shapes) >= 2 and len(shapes[1]) >= 2:
        w = shapes[1]  # (out, in/groups, *kernel); transposed convolutions: (in, out/groups, *kernel)
        return max(1, math.prod(w) // max(1, w[1] if "transpose" in name else w[0]))
    out_numel = max(1, math.prod(output_shape))
    k = max(1, max(math.prod(s) for s in shapes) // out_numel)
    if any(word in name for word in REDUCING_WORDS):
        k = max(k, max((max(s) for s in shapes if s), default=1))
    return k


def backward_reduction_length(api, input_shapes, output_shapes, grad_shape):
    """K for the gradient of one input (of shape `grad_shape`)."""
    name = api.split(".", 1)[0].lower()
    fwd = max((forward_reduction_length(api, input_shapes, o) for o in output_shapes), default=1)
    grad_numel = max(1, math.prod(grad_shape))
    # Gradients of an input broadcast into a larger output sum over the broadcast elements.
    k = max([fwd] + [max(1, math.prod(o) // grad_numel) for o in output_shapes])
    if name in MATMUL_LIKE or name.startswith("conv") or k > 1:
        # The other operand's rows are contracted: up to all elements per last dimension.
        k = max([k] + [math.prod(s) // s[-1] for s in list(input_shapes) + list(output_shapes)
                       if len(s) >= 2 and s[-1]])
    return k

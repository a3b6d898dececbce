"""Map a torch callable to its dump prefix and name, from `torch.overrides.get_overridable_functions()`.

Prefixes (msprobe-facts §3.3): Torch (torch.*, torch.linalg/fft/special as `linalg_norm` etc.),
Functional (torch.nn.functional), Tensor (methods and operators), VF (torch._VF.lstm, what nn.LSTM
calls; msProbe names it `VF.lstm`). Built once per process.
"""

import functools

import torch

from msprobe.pytorch.capture.ignored_apis import IGNORED_TENSOR_METHODS, IGNORED_TORCH_FUNCTIONS

_SUBMODULE_PREFIX = {"torch.linalg": "linalg_", "torch.fft": "fft_", "torch.special": "special_"}
# torch._VF functions msProbe records under the VF prefix (its _VF list: lstm). torch._VF.lstm is the
# very object torch.lstm is, so the mode sees one callable: it is named as nn.LSTM's call is.
_VF_NAMES = ("lstm",)


def _name(func):
    name = getattr(func, "__name__", None)
    if name is None and hasattr(func, "__get__"):
        return None  # a property getter: .shape, .dtype, ... are not computations
    return name


@functools.lru_cache(maxsize=1)
def build_api_table():
    """{callable: (prefix, name)} for every capturable public API of this torch installation."""
    table = {}
    overridable = torch.overrides.get_overridable_functions()
    for namespace, funcs in overridable.items():
        if namespace is torch.Tensor:
            prefix, ignored, name_prefix = "Tensor", IGNORED_TENSOR_METHODS, ""
        elif namespace is torch.nn.functional:
            prefix, ignored, name_prefix = "Functional", (), ""
        elif getattr(namespace, "__name__", None) in ("torch", "torch.functional"):
            prefix, ignored, name_prefix = "Torch", IGNORED_TORCH_FUNCTIONS, ""
        elif getattr(namespace, "__name__", None) in _SUBMODULE_PREFIX:
            prefix, ignored, name_prefix = "Torch", (), _SUBMODULE_PREFIX[namespace.__name__]
        else:
            continue  # property namespaces (Tensor.shape.__get__ ...)
        for func in funcs:
            name = _name(func)
            if not name or name in ignored or (name.startswith("_") and not name.startswith("__")):
                continue
            # torch.nn.functional re-exports many torch builtins (conv2d, ...): name them as
            # Functional, which is how users call them and how msProbe names them.
            if prefix == "Torch" and func in table:
                continue
            table[func] = (prefix, name if name.startswith(name_prefix) else name_prefix + name)
    for name in _VF_NAMES:
        func = getattr(torch._VF, name, None)
        if func in table:
            table[func] = ("VF", name)
    return table


def is_inplace(name):
    """In-place by naming convention (add_, __iadd__, __setitem__): output aliases the first input."""
    return (name.endswith("_") and not name.endswith("__")) or name.startswith("__i") and name not in (
        "__init__", "__invert__", "__index__", "__int__", "__iter__") or name == "__setitem__"


_DATA = torch._C.TensorBase.__dict__["data"]


def sets_data(func):
    """`t.data = other` (the setter of `data`, as a mode is handed it): `t` keeps neither its memory nor its
    shape (Megatron frees a pipeline stage's output so once it is sent)."""
    return getattr(func, "__self__", None) is _DATA and getattr(func, "__name__", None) == "__set__"


def _given(args, kwargs, pos, name, default=None):
    """Argument `name` of a call, at position `pos` when passed positionally."""
    return args[pos] if len(args) > pos else kwargs.get(name, default)


def _updates_running_stats(mean_pos, flag_name, flag_default):
    # the running statistics change when given and the call normalises by the batch's own
    return lambda args, kwargs: (_given(args, kwargs, mean_pos, "running_mean") is not None
                                 and bool(_given(args, kwargs, 5, flag_name, flag_default)))


def _writes_running_stats(mean_pos):
    return lambda args, kwargs: _given(args, kwargs, mean_pos, "running_mean") is not None


def _renorms_weight(args, kwargs):
    return _given(args, kwargs, 3, "max_norm") is not None  # rows over max_norm rescaled in the weight itself


@functools.lru_cache(maxsize=1)
def argument_writers():
    """{callable: writes(args, kwargs) -> bool} for the APIs that change an argument in place with no
    in-place name, `out=` or `inplace=True` to say so (and, for batch norm, no version-counter bump):
    the summaries waiting for their arguments are launched before they run, and what the summarizer
    cached for them is dropped once they have (capture/api_mode.py)."""
    F = torch.nn.functional
    table = {F.batch_norm: _updates_running_stats(1, "training", False),
             torch.batch_norm: _updates_running_stats(3, "training", False),
             torch.native_batch_norm: _updates_running_stats(3, "training", False),
             F.instance_norm: _updates_running_stats(1, "use_input_stats", True),
             torch.instance_norm: _updates_running_stats(3, "use_input_stats", True),
             F.embedding: _renorms_weight,
             F.embedding_bag: _renorms_weight,
             # SyncBatchNorm's steps (torch/nn/modules/_functions.py), each called on its own
             torch.batch_norm_update_stats: _writes_running_stats(1),
             torch.batch_norm_gather_stats: _writes_running_stats(3),
             torch.batch_norm_gather_stats_with_counts: _writes_running_stats(3)}
    # its observer's running min/max and its scale/zero point, on every call
    quant = getattr(torch, "fused_moving_avg_obs_fake_quant", None)
    if quant is not None:
        table[quant] = lambda args, kwargs: True
    return table

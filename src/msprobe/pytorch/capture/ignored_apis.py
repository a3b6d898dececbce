"""Tensor methods and torch functions that are not computations: never recorded at L1.

Everything else that `torch.overrides.get_overridable_functions()` lists is captured, so a new torch
release is covered without editing a list; this table only names what must be left out.
"""

# Structural or host-side queries and conversions: they compute nothing worth comparing.
IGNORED_TENSOR_METHODS = frozenset({
    "__repr__", "__str__", "__format__", "__len__", "__iter__", "__hash__", "__bool__", "__index__",
    "__int__", "__float__", "__complex__", "__array__", "__array_wrap__", "__reduce_ex__", "__reversed__",
    "__getstate__", "__setstate__", "__deepcopy__", "__dir__", "__contains__", "__dlpack__",
    "__dlpack_device__", "__array_priority__", "__cuda_array_interface__",
    "backward", "register_hook", "register_post_accumulate_grad_hook", "retain_grad", "requires_grad_",
    "detach_", "data_ptr", "untyped_storage", "storage", "_typed_storage", "storage_offset",
    "stride", "size", "dim", "ndimension", "nelement", "numel", "element_size", "is_contiguous",
    "is_floating_point", "is_complex", "is_signed", "is_pinned", "is_shared", "is_set_to", "is_inference",
    "is_nonzero", "is_coalesced", "item", "tolist", "numpy", "get_device", "type", "dim_order",
    "share_memory_", "pin_memory", "record_stream", "_is_view", "_base", "has_names", "refine_names",
    "rename", "rename_", "align_to", "unflatten", "_make_subclass", "as_subclass", "module_load",
    "__torch_function__", "__torch_dispatch__", "_version", "grad_fn", "_grad_fn", "_backward_hooks",
    "is_leaf", "_post_accumulate_grad_hooks", "nbytes", "itemsize", "_update_names", "_reduce_ex_internal",
})

IGNORED_TORCH_FUNCTIONS = frozenset({
    "is_tensor", "is_storage", "numel", "is_floating_point", "is_complex", "is_nonzero", "is_same_size",
    "is_grad_enabled", "is_inference_mode_enabled", "result_type", "can_cast", "promote_types",
    "broadcast_shapes", "typename", "is_conj", "is_neg", "is_signed", "is_inference", "get_default_dtype",
    "set_default_dtype", "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state",
    "use_deterministic_algorithms", "are_deterministic_algorithms_enabled", "compiled_with_cxx11_abi",
    "sym_int", "sym_float", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sum", "sym_fresh_size",
    "_assert", "is_distributed",
})

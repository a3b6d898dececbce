"""Data tables for api_table.py: what L1 never wraps, and which operators work in place."""

# Tensor methods that compute nothing worth recording (conversion, metadata, hooks, Python protocol).
IGNORED_TENSOR = frozenset("""
__array__ __bool__ __contains__ __deepcopy__ __float__ __getstate__ __hash__ __index__ __init__ __int__
__iter__ __len__ __new__ __repr__ __setstate__ __str__ __subclasshook__ __format__ __reduce__
__reduce_ex__ __sizeof__ __dir__ __copy__ __init_subclass__ __class_getitem__ __getattribute__
__setattr__ __delattr__ __array_function__ __array_ufunc__ __req__
asnumpy numpy item tolist register_hook remove_hook data_sync has_init init_data set_init_flag
set_dtype assign_value is_persistent_data is_contiguous is_complex is_floating_point is_signed
storage_offset stride strides ndimension dim nelement numel size element_size itemsize nbytes
asnumpy_of_slice_persistent_data flush_from_cache offload offload_file_path move_to _offload
_load _getitem_origin _setitem_origin untyped_storage data_ptr set_const_arg _need_contiguous
requires_grad_ retain_grad detach_ _detach_ _make_subclass _is_test_stub _release _data_sync
getitem_index_info setitem_index_info set_param_info convert_bytes_to_tensor from_dlpack to_dlpack
_flatten_tensors _get_flattened_tensors _is_flattened _is_initialized __ms_dispatch__ _clear_grad
""".split())
IGNORED_FUNCTIONS = frozenset(("absolute_import", "print_", "TensorDump", "tensordump", "hook", "grad",
                               "value_and_grad", "vjp", "jvp", "jacfwd", "jacrev", "vmap", "stop_gradient",
                               "depend", "jit", "is_tensor", "is_nonzero", "typeof", "dtype", "rank", "shape",
                               "size", "isconstant", "get_grad", "custom_info_register", "get_vm_impl_fn",
                               "constexpr", "primitive", "prim_attr_register", "deprecated"))
# Primitives a Cell holds that only read metadata (nn.Dense's shape_op): nothing computed to compare.
IGNORED_PRIMITIVES = frozenset(("Shape", "DType", "Rank", "TensorShape", "DynamicShape"))
IN_PLACE_DUNDERS = frozenset(("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                              "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__"))

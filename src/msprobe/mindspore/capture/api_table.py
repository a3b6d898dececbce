"""Which MindSpore callables L1 wraps, found at run time (no hand list to go stale):

    Mint            public functions of mindspore.mint
    MintFunctional  public functions of mindspore.mint.nn.functional
    Functional      public functions of mindspore.ops (Primitive classes and instances are not functions)
    Tensor          Tensor methods and operators (`a + b` is Tensor.__add__), minus non-computational ones
    MintDistributed / Distributed   collectives of mint.distributed / communication.comm_func

Each entry is (owner, attribute, prefix, in_place).
"""

import types

import mindspore as ms

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
IN_PLACE_DUNDERS = frozenset(("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                              "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__"))


def is_in_place(name):
    return name in IN_PLACE_DUNDERS or (name.endswith("_") and not name.endswith("__") and not name.startswith("_"))


def _functions(module, prefix):
    out = []
    for name in dir(module):
        if name.startswith("_") or name in IGNORED_FUNCTIONS:
            continue
        value = getattr(module, name, None)
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
            out.append((module, name, prefix, is_in_place(name)))
    return out


def _tensor_methods():
    from mindspore._c_expression import TensorPy
    names = set()
    for cls in (TensorPy, ms.Tensor):
        for name, value in vars(cls).items():
            if name in IGNORED_TENSOR or isinstance(value, (property, staticmethod, classmethod, type)):
                continue
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                continue
            if callable(value) and type(value).__name__ in ("function", "method_descriptor"):
                names.add(name)
    return [(ms.Tensor, name, "Tensor", is_in_place(name)) for name in sorted(names)]


def _collectives():
    out = []
    try:
        from mindspore.communication import comm_func
        out += [(comm_func, n, "Distributed", True) for _, n, _, _ in _functions(comm_func, "Distributed")
                if not n.startswith("get_")]
    except ImportError:
        pass
    dist = getattr(ms.mint, "distributed", None)
    if dist is not None:
        skip = ("get_", "is_", "init_", "new_", "destroy_")
        out += [(dist, n, "MintDistributed", True) for _, n, _, _ in _functions(dist, "MintDistributed")
                if not n.startswith(skip)]
    return out


def build_api_table():
    """Every (owner, attribute, prefix, in_place) L1 wraps."""
    table = _functions(ms.mint, "Mint") + _functions(ms.mint.nn.functional, "MintFunctional")
    table += _functions(ms.ops, "Functional")
    table += _tensor_methods()
    table += _collectives()
    return table

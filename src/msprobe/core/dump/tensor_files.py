"""Reading and writing tensor dump files.

This module owns the on-disk tensor formats: the ``.npy`` files our own writer
saves, and the files written by the reference msProbe tool (``.pt`` archives
made by ``torch.save(tensor)`` for PyTorch, ``.npy`` for MindSpore).

It is framework-neutral core code and must not import torch or mindspore, not
even lazily. ``.pt`` files are decoded with a restricted unpickler that knows
only the few globals ``torch.save`` emits for a plain tensor and maps them to
harmless stubs, so an untrusted file can never run code.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import math
import os
import pickle
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import as_strided

from msprobe.core.errors import DumpFormatError
from msprobe.core.file_limits import check_regular, open_regular
from msprobe.core.safe_files import FILE_MODE, open_new

# torch storage class name -> (numpy dtype of the stored elements, torch dtype string).
# bfloat16 has no numpy dtype: its raw 16-bit patterns are read as uint16 and upcast later.
_STORAGES = {
    "FloatStorage": ("float32", "torch.float32"),
    "DoubleStorage": ("float64", "torch.float64"),
    "HalfStorage": ("float16", "torch.float16"),
    "BFloat16Storage": ("uint16", "torch.bfloat16"),
    "CharStorage": ("int8", "torch.int8"),
    "ShortStorage": ("int16", "torch.int16"),
    "IntStorage": ("int32", "torch.int32"),
    "LongStorage": ("int64", "torch.int64"),
    "ByteStorage": ("uint8", "torch.uint8"),
    "BoolStorage": ("bool", "torch.bool"),
    "ComplexFloatStorage": ("complex64", "torch.complex64"),
    "ComplexDoubleStorage": ("complex128", "torch.complex128"),
    "UntypedStorage": ("uint8", "torch.uint8"),  # torch reads untyped storages as raw bytes
}
_BYTE_ORDERS = {"little": "<", "big": ">"}
_NPY_MAGIC = b"\x93NUMPY"
# What malformed input can raise from zipfile, pickle or numpy; reported as DumpFormatError.
_BAD_INPUT = (OSError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
              OverflowError, RecursionError, pickle.UnpicklingError, zipfile.BadZipFile, zlib.error)


@dataclass(frozen=True)
class LoadedTensor:
    """A tensor read from a dump file.

    Attributes:
        array: the values. bfloat16 tensors come back as float32 (an exact upcast).
        dtype: the original dtype: a torch dtype string such as ``'torch.bfloat16'``
            for ``.pt`` files, the numpy dtype name such as ``'float32'`` for ``.npy``.
    """

    array: np.ndarray
    dtype: str


# Harmless stand-ins for what the unpickler meets: a torch.*Storage class (only its dtypes), the
# elements of one data/<key> record (1-D, file byte order), a rebuilt tensor (native byte order).
_StorageType = collections.namedtuple("_StorageType", "np_dtype torch_dtype")
_Storage = collections.namedtuple("_Storage", "data torch_dtype")
_Tensor = collections.namedtuple("_Tensor", "array torch_dtype")


def _rebuild_tensor(storage, storage_offset, size, stride, *_grad_hooks_metadata):
    """Stub for ``torch._utils._rebuild_tensor(_v2)``: copies the strided view out of the storage."""
    if not isinstance(storage, _Storage):
        raise ValueError("tensor rebuilt from something that is not a storage")
    size, stride = tuple(size), tuple(stride)
    numbers = (storage_offset, *size, *stride)
    if len(size) != len(stride) or not all(type(v) is int and v >= 0 for v in numbers):
        raise ValueError(f"bad tensor geometry: offset={storage_offset!r} size={size!r} stride={stride!r}")
    data = storage.data
    native = data.dtype.newbyteorder("=")
    if 0 in size:
        array = np.empty(size, native)
    else:
        # as_strided does no bounds checking: a crafted file must not make it read past the storage.
        if storage_offset + sum((n - 1) * s for n, s in zip(size, stride)) >= len(data):
            raise ValueError(f"tensor geometry size={size} stride={stride} offset={storage_offset} "
                             f"exceeds its storage of {len(data)} elements")
        view = as_strided(data[storage_offset:], shape=size, strides=[s * data.itemsize for s in stride])
        array = view.astype(native, copy=True)
    if storage.torch_dtype == "torch.bfloat16":
        # bfloat16 is the high half of a float32, so this upcast is exact.
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return _Tensor(array, storage.torch_dtype)


def _rebuild_parameter(data, _requires_grad, _backward_hooks, _state=None):
    """Stub for ``torch._utils._rebuild_parameter(_with_state)``: a Parameter is just its data."""
    if not isinstance(data, _Tensor):
        raise ValueError("parameter rebuilt from something that is not a tensor")
    return data


class _TensorUnpickler(pickle.Unpickler):
    """Unpickles ``data.pkl`` of a ``torch.save`` archive, allowing only plain-tensor globals."""

    def __init__(self, file, archive, prefix, byte_order, path):
        super().__init__(file)
        self._archive, self._prefix, self._byte_order, self._path = archive, prefix, byte_order, path
        self._storages = {}

    def find_class(self, module, name):
        if module == "torch._utils" and name in ("_rebuild_tensor", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch._utils" and name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
            return _rebuild_parameter
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict  # holds backward hooks; always empty in a dump
        if module in ("torch", "torch.storage") and name in _STORAGES:
            return _StorageType(*_STORAGES[name])
        raise DumpFormatError(f"{self._path}: refusing to load global '{module}.{name}'; "
                              "expected only the globals torch.save writes for a plain tensor")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)
                and type(pid[4]) is int and pid[4] >= 0):
            raise ValueError(f"unsupported persistent id {pid!r:.100}")
        _, storage_type, key, _location, numel = pid
        if key not in self._storages:  # tensors may share a storage
            dtype = np.dtype(storage_type.np_dtype).newbyteorder(self._byte_order)
            with self._archive.open(f"{self._prefix}data/{key}") as member:
                raw = member.read(numel * dtype.itemsize)  # never more: a crafted record may be huge
            self._storages[key] = _Storage(np.frombuffer(raw, dtype, count=numel), storage_type.torch_dtype)
        return self._storages[key]


def _load_pt(path):
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pickles = [n for n in names if n == "data.pkl" or n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise ValueError(f"expected one data.pkl record, found {len(pickles)}")
        prefix = pickles[0][: -len("data.pkl")]
        byte_order = "<"  # archives from before the byteorder record were little-endian
        if prefix + "byteorder" in names:
            with archive.open(prefix + "byteorder") as record:
                text = record.read(16).decode("ascii").strip()
            if text not in _BYTE_ORDERS:
                raise ValueError(f"unknown byteorder record {text!r}")
            byte_order = _BYTE_ORDERS[text]
        with archive.open(pickles[0]) as file:
            result = _TensorUnpickler(file, archive, prefix, byte_order, path).load()
    if not isinstance(result, _Tensor):
        raise ValueError(f"the archive holds a {type(result).__name__}, not a single tensor")
    return LoadedTensor(result.array, result.torch_dtype)


def _load_npy(path, mmap):
    # np.load would take anything without the magic for a pickle (or, for a zip, an .npz archive).
    with open_regular(path, "MSPROBE_MAX_TENSOR_BYTES") as file:
        if file.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
            raise ValueError("no .npy magic number at the start of the file")
        file.seek(0)
        version = np.lib.format.read_magic(file)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read_header:
            raise ValueError(f".npy format version {version} is not supported")
        shape, _fortran, dtype = read_header[version](file)
        if dtype.hasobject:
            raise ValueError(f"dtype {dtype} holds Python objects")
        expected = file.tell() + math.prod(shape) * dtype.itemsize
        size = os.fstat(file.fileno()).st_size
    if size != expected:  # the header's shape and the data disagree: truncated, or a lying header
        raise ValueError(f"header says shape {list(shape)} {dtype} ({expected:,} bytes with the header), "
                         f"the file holds {size:,} bytes")
    array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    return LoadedTensor(array, array.dtype.name)


def load_tensor_file(path, *, mmap=True) -> LoadedTensor:
    """Reads one tensor from a ``.npy`` or ``.pt`` dump file.

    Args:
        path: the file. Its suffix picks the format: ``.npy`` (numpy, no pickles) or
            ``.pt`` (a ``torch.save`` of a single tensor, read without torch).
        mmap: for ``.npy``, map the file read-only instead of reading it into memory.
            ``.pt`` files are always read into memory.

    Returns:
        The tensor's values and original dtype.

    Raises:
        DumpFormatError: the suffix is unknown, or the file is missing, truncated,
            not in the expected format, or (``.pt``) refers to anything other than
            the globals ``torch.save`` writes for a plain tensor.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".pt"):
        raise DumpFormatError(f"{path}: unknown tensor file type {path.suffix!r}; expected .npy or .pt")
    expected = "an .npy array file" if suffix == ".npy" else "a torch.save tensor file (.pt zip archive)"
    try:
        if not os.path.lexists(path):
            raise FileNotFoundError(path)
        if suffix == ".pt":
            check_regular(path, "MSPROBE_MAX_TENSOR_BYTES")
        return _load_npy(path, mmap) if suffix == ".npy" else _load_pt(path)
    except FileNotFoundError as exc:
        raise DumpFormatError(f"{path}: no such file; expected {expected}") from exc
    except _BAD_INPUT as exc:
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())  # keep the message on one line
        raise DumpFormatError(f"{path}: not {expected} ({detail})") from exc


def save_npy(path, array) -> None:
    """Writes ``array`` to ``path`` in ``.npy`` format, atomically.

    The data goes to a temporary file in the same directory, which then replaces
    ``path``, so readers never see a partly written file.

    Args:
        path: the destination, written as given (no ``.npy`` is appended).
        array: anything ``numpy.save`` accepts without pickling.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp makes it 0600
        with os.fdopen(fd, "wb") as file:
            np.save(file, array, allow_pickle=False)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_npy(path, array) -> None:
    """Writes ``array`` as ``.npy`` to ``path`` with numpy's own writer: the header, then the array's memory.

    Quicker than :func:`save_npy` (no temporary file, no copy of a C-contiguous array) but not atomic:
    a process killed mid-write leaves a short file, which :func:`load_tensor_file` reports as truncated;
    a failed write (a full disk) removes it. Created 0640, never through a symbolic link.
    """
    if not array.flags.c_contiguous:  # numpy writes an F-ordered array as such: the files stay C-ordered
        array = array.copy(order="C")  # (np.ascontiguousarray would turn a 0-d array into 1-d)
    fd = open_new(path)
    try:
        with os.fdopen(fd, "wb") as f:
            np.lib.format.write_array(f, array, allow_pickle=False)
    except OSError as e:
        full = e.errno is None and _no_space_left(path)  # numpy's short write names no cause
        with contextlib.suppress(OSError):
            os.unlink(path)  # a full disk: no short file left to pass for a tensor
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from e
        raise


def _no_space_left(path) -> bool:
    """True when the file system holding ``path`` has no block left (checked before the short file goes)."""
    try:
        return os.statvfs(os.path.dirname(os.path.abspath(path))).f_bavail == 0
    except OSError:
        return False


def link_file(src, dst) -> bool:
    """Makes ``dst`` a hard link to the already written ``src`` (same bytes, no copy).

    Returns False when the file system cannot link, so the caller writes the file itself.
    """
    try:
        os.link(src, dst)
    except FileExistsError:
        try:
            os.unlink(dst)
            os.link(src, dst)
        except OSError:
            return False
    except OSError:
        return False
    return True

"""Copies between the host and a device: a tensor's bytes for the host, small index tables for the device."""

import ctypes
import functools

import numpy as np
import torch


def host_copy(t):
    """A contiguous CPU copy of `t` in its own dtype, safe from later in-place edits of `t`."""
    x = t.detach()
    if x.device.type != "cpu":
        return x.to("cpu").contiguous()
    return x.clone(memory_format=torch.contiguous_format)


def host_view(t):
    """`t`'s own CPU memory as a contiguous tensor when it already is one (no copy), else a copy."""
    x = t.detach()
    if x.device.type == "cpu" and x.is_contiguous() and not x.is_conj() and not x.is_neg():
        return x
    return host_copy(x).resolve_conj().resolve_neg()


def numpy_of(x_cpu):
    """numpy array for a .npy file; dtypes numpy lacks (bf16, fp8) are upcast to float32, exactly; a
    quantized, sparse or nested tensor is saved as the dense float values it stands for."""
    if x_cpu.is_quantized:
        return x_cpu.dequantize().numpy()
    if x_cpu.is_nested:  # the padded tensor its record's shape is (zeros where a component is shorter)
        x_cpu = torch.nested.to_padded_tensor(x_cpu, 0)
    elif x_cpu.layout is not torch.strided:  # sparse, mkldnn: the dense tensor it stands for
        x_cpu = x_cpu.to_dense()
    if x_cpu.dtype == torch.bfloat16 or (x_cpu.is_floating_point() and x_cpu.dtype.itemsize == 1):
        x_cpu = x_cpu.float()
    return x_cpu.numpy()


def numpy_view(x_cpu):
    """`numpy_of` a CPU tensor, reading a contiguous one's memory in place without `.numpy()`, which
    marks the storage non-resizable for good (FSDP2 frees an unsharded parameter with
    `storage.resize_(0)`). The array holds `x_cpu` (a copy made for it lives as long as it does)."""
    if (x_cpu.is_quantized or x_cpu.is_nested or x_cpu.layout is not torch.strided or x_cpu.dtype == torch.bfloat16
            or (x_cpu.is_floating_point() and x_cpu.dtype.itemsize == 1)):
        return numpy_of(x_cpu)  # upcast, dequantized or dense: a copy
    if not x_cpu.is_contiguous() or x_cpu.is_conj() or x_cpu.is_neg() or x_cpu.numel() == 0:
        return numpy_of(host_copy(x_cpu).resolve_conj().resolve_neg())
    buf = (ctypes.c_char * (x_cpu.numel() * x_cpu.element_size())).from_address(x_cpu.data_ptr())
    buf.owner = x_cpu  # the array's base is `buf`: the memory stays while the array does
    return np.frombuffer(buf, dtype=_numpy_dtype(x_cpu.dtype)).reshape(x_cpu.shape)


@functools.lru_cache(maxsize=None)
def _numpy_dtype(dtype):
    return torch.empty(0, dtype=dtype).numpy().dtype


def to_device_async(host, device):
    """CPU tensor `host` on `device`, copied from pinned memory without waiting for the device's queue
    (`torch.tensor(values, device=...)` waits for it, as a read-back does)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def index_tensor(values, device):
    """int64 tensor of `values` (a list, tuple or numpy array) on `device`, without waiting for it."""
    if device.type == "cuda":
        return _staging.to_device(np.asarray(values, dtype=np.int64), device)
    return to_device_async(torch.as_tensor(values, dtype=torch.int64), device)


class PinnedStaging:
    """Pinned host buffers, kept and reused, that small int64 tables (kernel arguments, indices) go to a
    CUDA device from: no pinned allocation per launch. A buffer is written again only once the copy out of
    it is done (its event says so without waiting); while all are busy a new one is made."""

    KEEP = 8  # buffers kept; one more is made (and the oldest let go) while all are busy
    MIN_ELEMENTS = 4096

    def __init__(self):
        # device -> [pinned int64 tensor, its numpy view, event after its last copy], oldest first
        self._buffers = {}

    def to_device(self, values, device):
        """int64 numpy array `values` on CUDA `device`, copied without waiting for the device's queue."""
        n = values.size
        kept = self._buffers.setdefault(device, [])
        for i, entry in enumerate(kept):
            if entry[0].numel() >= n and entry[2].query():
                del kept[i]
                break
        else:
            size = max(n, self.MIN_ELEMENTS, *(e[0].numel() for e in kept[-1:]))
            host = torch.empty(size, dtype=torch.int64, pin_memory=True)
            entry = [host, host.numpy(), torch.cuda.Event()]
            if len(kept) >= self.KEEP:
                del kept[0]  # still being copied from: torch's host allocator keeps it until done
        entry[1][:n] = values.reshape(-1)
        out = entry[0][:n].to(device, non_blocking=True).view(values.shape)
        entry[2].record(torch.cuda.current_stream(device))  # the stream the copy was queued on
        kept.append(entry)
        return out


_staging = PinnedStaging()


def table_to_device(values, device):
    """int64 numpy array `values` on `device` without waiting for it (CUDA: from a reused pinned buffer)."""
    if device.type == "cuda":
        return _staging.to_device(values, device)
    return to_device_async(torch.from_numpy(values), device)

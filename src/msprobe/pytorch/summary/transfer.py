"""Copies between the host and a device: a tensor's bytes for the host, small index tables for the device."""

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
    """numpy array for a .npy file; dtypes numpy lacks (bf16, fp8) are upcast to float32, exactly."""
    if x_cpu.dtype == torch.bfloat16 or (x_cpu.is_floating_point() and x_cpu.dtype.itemsize == 1):
        x_cpu = x_cpu.float()
    return x_cpu.numpy()


def to_device_async(host, device):
    """CPU tensor `host` on `device`, copied from pinned memory without waiting for the device's queue
    (`torch.tensor(values, device=...)` waits for it, as a read-back does)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def index_tensor(values, device):
    """int64 tensor of `values` (a list or numpy array) on `device`, without waiting for it."""
    return to_device_async(torch.as_tensor(values, dtype=torch.int64), device)

"""Tensor -> record: Max/Min/Mean/Norm reduced together on the tensor's device, one transfer.

Conventions (msprobe-facts §3.2): bool -> Max=any, Min=all, Mean/Norm null; complex -> statistics of
|x|; empty -> all null; fp16/bf16 reduced in float32 (no overflow of the norm in fp16). A tensor seen
again unchanged (same object, same version counter) reuses its statistics: an API's input is usually
the previous API's output. Guarded by benchmarks/dump_overhead.py.
"""

import weakref
import zlib

import torch

from msprobe.core.dump.json_append import json_float

_LOW_FLOATS = (torch.float16, torch.bfloat16)
_CACHE_LIMIT = 4096


def dtype_name(dtype):
    return str(dtype)  # 'torch.float32', as msProbe writes it


class Summarizer:
    """Computes tensor records; keeps a small identity cache of recent results.

    Args:
        stats: compute Max/Min/Mean/Norm (False for the structure task).
        md5: add the CRC-32 of the tensor bytes under "md5" (computed on the writer pool).
        defer: keep statistics on the device and resolve them later (async_dump).
    """

    def __init__(self, stats=True, md5=False, defer=False):
        self.stats = stats
        self.md5 = md5
        self.defer = defer
        self._cache = {}

    def clear(self):
        self._cache.clear()

    def forget(self, tensors):
        """Drop cached results of tensors changed behind autograd's back (collectives write in place
        without bumping the version counter)."""
        for t in tensors:
            self._cache.pop(id(t), None)

    def summarize(self, t, submit=None):
        """Record for tensor `t` (a fresh dict the caller may extend) and the CRC-32 future or None.

        Args:
            submit: runs a callable off the training thread (the writer pool); needed for md5.
        """
        hit = self._cache.get(id(t))
        # inference tensors have no version counter: never cached, never looked up
        version = -1 if t.is_inference() else t._version
        if hit is not None and hit[0]() is t and hit[1] == version:
            rec, crc = dict(hit[2]), hit[3]
        else:
            rec = {"type": "torch.Tensor", "dtype": dtype_name(t.dtype), "shape": list(t.shape)}
            if self.stats:
                rec.update(self._stats(t))
            crc = None
            if self.md5 and submit is not None:
                copy = host_copy(t)
                crc = submit(lambda: crc32_of(copy), copy.numel() * copy.element_size())
            if len(self._cache) > _CACHE_LIMIT:
                self._cache.clear()
            if version >= 0:
                self._cache[id(t)] = (weakref.ref(t), version, rec, crc)
            rec = dict(rec)
        rec["requires_grad"] = t.requires_grad
        return rec, crc

    def _stats(self, t):
        x = t.detach()
        if x.numel() == 0:
            return {"Max": None, "Min": None, "Mean": None, "Norm": None}
        with torch.no_grad():
            if x.dtype == torch.bool:
                vals = torch.stack((x.any(), x.all())).tolist()
                return {"Max": vals[0], "Min": vals[1], "Mean": None, "Norm": None}
            if x.is_complex():
                x = x.abs()
            if not x.is_floating_point():
                mn, mx = torch.aminmax(x)
                xf = x.to(torch.float64)
                vals = torch.stack((xf.mean(), torch.linalg.vector_norm(xf))).tolist()
                return {"Max": mx.item(), "Min": mn.item(), "Mean": vals[0], "Norm": vals[1]}
            if x.dtype in _LOW_FLOATS or x.dtype.itemsize == 1:
                x = x.float()
            mn, mx = torch.aminmax(x)
            packed = torch.stack((mx, mn, x.mean(), torch.linalg.vector_norm(x)))
            if self.defer:
                return {"_deferred": packed}
            mx, mn, mean, norm = packed.tolist()
            return {"Max": json_float(mx), "Min": json_float(mn), "Mean": json_float(mean),
                    "Norm": json_float(norm)}


def resolve_deferred(rec):
    """Turn a deferred statistics record (async_dump) into plain numbers, in place."""
    packed = rec.pop("_deferred", None)
    if packed is not None:
        mx, mn, mean, norm = packed.tolist()
        rec.update(Max=json_float(mx), Min=json_float(mn), Mean=json_float(mean), Norm=json_float(norm))


def host_copy(t):
    """A contiguous CPU copy of `t` in its own dtype, safe from later in-place edits of `t`."""
    x = t.detach()
    if x.device.type != "cpu":
        return x.to("cpu").contiguous()
    return x.clone(memory_format=torch.contiguous_format)


def numpy_of(x_cpu):
    """numpy array for a .npy file; dtypes numpy lacks (bf16, fp8) are upcast to float32, exactly."""
    if x_cpu.dtype == torch.bfloat16 or (x_cpu.is_floating_point() and x_cpu.dtype.itemsize == 1):
        x_cpu = x_cpu.float()
    return x_cpu.numpy()


def crc32_of(x_cpu):
    """CRC-32 of the tensor's raw bytes as 8 hex digits (msProbe's "md5" field)."""
    data = x_cpu.reshape(-1).view(torch.uint8).numpy() if x_cpu.numel() else b""
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"

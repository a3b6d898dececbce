"""Tensor -> record: Max/Min/Mean/Norm in one pass over the tensor's memory (the C kernel of
core/dump/moments.py, for float32/float64/bfloat16 CPU tensors) or torch's reductions otherwise.

Conventions (msprobe-facts §3.2): bool -> Max=any, Min=all, Mean/Norm null; complex -> statistics of
|x|; empty -> all null; sums of fp16/bf16 in float64 (no overflow of the norm in fp16, no drift).

Cost, per float tensor: one pass of the kernel; without it (other dtypes, devices, a NaN or inf in
the tensor) aminmax, sum and dot on the flat memory (Mean = sum/n, Norm = sqrt(dot));
a view whose strides are a permutation of a dense layout (a transpose) is reduced in memory order,
not element order. Values seen again unchanged — the same memory at the same version counter, while
that memory is alive (a weak reference to its storage) — reuse their statistics: an API's input is
usually the previous API's output, an optimizer's gradient is the one backward produced. A tensor
is keyed by the elements it covers, not its shape: `view`, `reshape`, `transpose`, `flatten`
outputs (and their gradients) hold the same elements as their input, so the same statistics; the
checksum of a permuted view reads other bytes first, so with md5 a non-contiguous view is keyed exactly.
The same tensor object seen again (same version, memory and shape) takes its record from a per-object
table before any key is built: the common case, an output passed straight to the next API.
Guarded by benchmarks/dump_overhead.py.
"""

import math
import os
import weakref

import torch

from msprobe.core.checksum import checksum_hex, finish, wordsum
from msprobe.core.dump import moments as native
from msprobe.core.dump.json_append import json_float
from msprobe.pytorch.device_summary import DeviceSummaries
from msprobe.pytorch.tensor_subclasses import plain_tensor

_LOW_FLOATS = (torch.float16, torch.bfloat16)
_CACHE_LIMIT = 4096
# integer tensors up to this size are summarised in Python (one tolist) instead of torch reductions
_SMALL_INTS = 64
# below this many elements one kernel thread is quicker than waking a second (the kernel splits
# no finer than 16K elements a thread)
_PARALLEL_MIN = 32 * 1024
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided
# the kernel itself, without the wrapper's frame (None when not built or MSPROBE_NATIVE_STATS=0)
_kernel = native._moments if native.ENABLED else None
_NATIVE_KINDS = {torch.float32: native.KINDS["float32"], torch.float64: native.KINDS["float64"],
                 torch.bfloat16: native.KINDS["bfloat16"]}
_DTYPE_NAMES = {}


def dtype_name(dtype):
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)  # 'torch.float32', as msProbe writes it
    return name


class CacheEntry:
    """What is known about one stretch of memory at one version: its statistics (and checksum) —
    `values`, plus `slots` still on their way from the device — and, once written, the .npy file of
    the tensor `layout` (shape, strides) that was saved from it."""

    __slots__ = ("ref", "version", "values", "slots", "file", "layout")

    def __init__(self, ref, version, values, slots):
        self.ref, self.version, self.values, self.slots = ref, version, values, slots
        self.file = self.layout = None

    def file_for(self, t):
        """The saved file when it holds exactly `t` (same shape and strides), else None."""
        if self.file is not None and self.layout == (t.shape, t.stride()):
            return self.file
        return None

    def set_file(self, t, path):
        self.file, self.layout = path, (t.shape, t.stride())


def fill_from_slot(rec, slot):
    """`rec` gets the slot's values now or when it is resolved (perhaps on the lane thread: this appends
    to `waiting` before looking again, the resolve sets `values` before it fills the waiting records)."""
    values = slot.values
    if values is None:
        slot.waiting.append(rec)
        values = slot.values
    if values is not None:
        rec.update(values)


_STAT_FIELDS = {"Max": None, "Min": None, "Mean": None, "Norm": None}
_STAT_MD5_FIELDS = dict(_STAT_FIELDS, md5=None)


class Summarizer:
    """Computes tensor records; keeps a cache of recent results keyed by memory and version.

    A CPU tensor's statistics come at once from the C kernel (or torch's reductions); anything else
    — tensors on an accelerator, and CPU tensors when `device_path` is set — is summarised into
    device slots (pytorch/device_summary.py) that `start_resolve` brings to the host in one copy.
    The md5 checksum (wordsum64, core/checksum.py) is read in place on the CPU, in a slot elsewhere.

    Args:
        stats: compute Max/Min/Mean/Norm (False for the structure task).
        md5: add the wordsum64 checksum of the tensor bytes under "md5".
        device_path: summarise CPU tensors through the device slots too (MSPROBE_DEVICE_SUMMARY=1:
            what the tests use to check the accelerator path on a CPU).
    """

    def __init__(self, stats=True, md5=False, device_path=None):
        self.stats = stats
        self.md5 = md5
        if device_path is None:
            device_path = os.environ.get("MSPROBE_DEVICE_SUMMARY", "0") == "1"
        self.device_path = device_path
        self.slots = DeviceSummaries()
        self._cache = {}
        # id(tensor) -> (weak ref, version, data_ptr, shape, record, entry): a tensor object summarised
        # before (an API's input is usually the previous API's output object) skips the memory key
        self._objects = {}
        self._native_kinds = _NATIVE_KINDS if native.ENABLED and not device_path else {}
        self._fields = _STAT_MD5_FIELDS if md5 and stats else ({"md5": None} if md5 else _STAT_FIELDS)
        self.blank_fields = self._fields if (stats or md5) else {}  # a record's value fields, all null

    @property
    def pending(self):
        """Summaries in device slots, not yet on the host."""
        return self.slots.pending

    @property
    def waiting(self):
        """Deferred summaries not launched yet (see DeviceSummaries)."""
        return self.slots.waiting

    def launch(self, touching=None):
        """Launch the deferred summaries now: something may change their tensors in place (`touching`:
        which tensors, when known; see DeviceSummaries.launch)."""
        if self.slots.waiting:
            self.slots.launch(touching)

    def start_resolve(self):
        return self.slots.start_resolve()

    def clear(self):
        self._cache.clear()
        self._objects.clear()

    def forget(self, tensors):
        """Drop cached results of tensors changed behind autograd's back (collectives write in place
        without bumping the version counter)."""
        for t in tensors:
            if type(t) not in _PLAIN:
                t = plain_tensor(t)[0]  # a DTensor changed in place: its local shard changed
                if type(t) not in _PLAIN:
                    continue
            self._objects.pop(id(t), None)
            try:
                self._cache.pop(self._memory_key(t, t.numel())[0], None)
            except (RuntimeError, NotImplementedError):
                pass

    def summarize(self, t, defer=False):
        """Record for tensor `t` (a fresh dict the caller may extend; fields still on the device are
        filled in when resolved) and its cache entry (or None). `defer`: a device summary may wait for
        the next `launch()` (the caller launches before anything changes `t` in place).

        The entry's `file_for(t)` is where a tensor laid out as `t` was saved, if one was: the caller
        may link to it. (The hot path of every dump: attributes are read once, in one place.)
        """
        seen = self._objects.get(id(t))
        if (seen is not None and seen[0]() is t and seen[1] == t._version and seen[2] == t.data_ptr()
                and seen[3] == t.shape):
            rec = seen[4].copy()
            rec["requires_grad"] = t.requires_grad
            entry = seen[5]
            for slot in entry.slots:
                fill_from_slot(rec, slot)
            return rec, entry
        dtype = t.dtype
        name = _DTYPE_NAMES.get(dtype) or dtype_name(dtype)
        if not (self.stats or self.md5):  # structure task: nothing to compute, nothing to remember
            return {"type": "torch.Tensor", "dtype": name, "shape": list(t.shape),
                    "requires_grad": t.requires_grad}, None
        key = span = None
        n = t.numel()
        # plain tensors only: subclasses (fake, wrapper) may have no real memory to key on
        if type(t) in _PLAIN and t.layout is _STRIDED and not t.is_inference():
            try:
                if n > 1 and t.is_contiguous():
                    span = ((1, n),)
                    key = (t.data_ptr(), dtype, t.device, span)
                else:
                    key, span = self._memory_key(t, n)
            except (RuntimeError, NotImplementedError):  # no storage (wrapper subclasses, fake tensors)
                key = None
        shape = t.shape
        if key is not None:
            hit = self._cache.get(key)
            # the same storage, alive: the memory was not freed and reused by another tensor since (FSDP2
            # frees an unsharded parameter's memory by resizing its storage to 0, keeping the storage)
            if hit is not None and t._version == hit.version and hit.ref() is t.untyped_storage():
                return self._record(t, name, shape, key, hit, hit.values, hit.slots), hit
        values, slots = {}, []
        on_host = t.is_cpu and not self.device_path
        if self.stats:
            if on_host or n == 0:
                values = self._stats(t, n, span)
            else:
                slots.append(self._stats_slot(t, n, span, defer))
        if self.md5:
            if on_host or n == 0:
                values["md5"] = checksum_of_tensor(t)  # `values` is this call's own dict
            else:
                slots.append(self.slots.checksum(t.detach(), defer))
        entry = None
        if key is not None:
            if len(self._cache) > _CACHE_LIMIT:
                self._cache.clear()
            try:
                entry = self._cache[key] = CacheEntry(weakref.ref(t.untyped_storage()), t._version, values, slots)
            except (RuntimeError, TypeError):
                entry = None
        return self._record(t, name, shape, key, entry, values, slots), entry

    def _record(self, t, name, shape, key, entry, values, slots):
        """`t`'s record: its fields in msProbe's order (those still on the device null until their slots
        are resolved); remembered for the tensor object when it has a cache entry."""
        rec = {"type": "torch.Tensor", "dtype": name, "shape": list(shape)}
        rec.update(values if len(values) == len(self._fields) else dict(self._fields, **values))
        if entry is not None:
            self._remember(t, key, shape, rec, entry)
        rec["requires_grad"] = t.requires_grad
        for slot in slots:
            fill_from_slot(rec, slot)
        return rec

    def _remember(self, t, key, shape, rec, entry):
        """The tensor object's record (without requires_grad) for its next summary at this version."""
        if len(self._objects) > _CACHE_LIMIT:
            self._objects.clear()
        self._objects[id(t)] = (weakref.ref(t), entry.version, key[0], shape, rec.copy(), entry)

    def _stats_slot(self, t, n, span, defer):
        """A device slot of `t`'s Max/Min/Sum/Sum of squares (complex: of |t|); `span`: element_span(t)
        when the caller has it."""
        x = t.detach()
        if x.is_complex():
            with torch.no_grad():
                x = x.abs()
            span = None
        elif span is not None and len(span) == 1 and span[0][0] == 1 and n == span[0][1]:
            return self.slots.stats(x, n, x, defer)  # contiguous: the caller has looked
        dense = memory_order(x)
        if dense.is_contiguous():
            return self.slots.stats(x, n, dense, defer)
        if span is None:
            span = element_span(x)
        # rows of a wider tensor (one chunk of a fused qkv projection), not overlapping
        rows = ((span[1][1], span[0][0]) if len(span) == 2 and span[1][0] == 1 and span[0][0] >= span[1][1]
                else None)
        return self.slots.stats(x, n, None, defer, rows)

    def _memory_key(self, t, n):
        """(cache key, element span or None) of `t`: the key is the elements `t` covers — where it
        starts and its strides with sizes in memory order, adjacent dimensions merged — so every view
        of the same elements shares it; with md5 only contiguous views share (the checksum reads
        elements in index order)."""
        if n > 1 and t.is_contiguous():
            span = ((1, n),)
        elif n <= 1 or self.md5:
            return _memory_key(t), None
        else:
            span = element_span(t)
        return (t.data_ptr(), t.dtype, t.device, span), span

    def _stats(self, t, n=None, span=None):
        """Max/Min/Mean/Norm of CPU tensor `t` now; `span` is `element_span(t)` when the caller has it."""
        if n is None:
            n = t.numel()
        if n == 0:
            return {"Max": None, "Min": None, "Mean": None, "Norm": None}
        kind = self._native_kinds.get(t.dtype)
        if kind is not None and t.is_cpu:
            if span is None:
                span = ((1, n),) if t.is_contiguous() else element_span(t)
            got = None
            # As many kernel threads as torch's intra-op pool has now (a forked worker set to one must
            # get one: libgomp's team does not survive fork). The kernel's OpenMP team is torch's own
            # (the same libgomp), whose workers still spin from the op that made the tensor.
            threads = torch.get_num_threads() if n >= _PARALLEL_MIN else 1
            # one dense run (contiguous or a transpose), or rows of runs (a slice of a wider tensor)
            if len(span) == 1 and span[0][0] == 1:
                got = _kernel(t.data_ptr(), n, kind, threads)
            elif len(span) == 2 and span[1][0] == 1 and span[0][0] >= span[1][1]:  # rows do not overlap
                got = _kernel(t.data_ptr(), span[1][1], kind, threads, span[0][1], span[0][0])
            if got is not None:  # None: a NaN or inf is in there (torch's reductions say how), or other layouts
                return native.stats_record(got)
        x = t.detach()
        with torch.no_grad():
            if x.dtype == torch.bool:
                return {"Max": bool(x.any()), "Min": bool(x.all()), "Mean": None, "Norm": None}
            if x.is_complex():
                x = x.abs()
            x = memory_order(x)
            if not x.is_floating_point():
                if n <= _SMALL_INTS:
                    # a step counter, class labels: Python's exact ints beat five torch reductions here
                    vals = x.reshape(-1).tolist()
                    return {"Max": max(vals), "Min": min(vals), "Mean": sum(vals) / n,
                            "Norm": math.sqrt(sum(v * v for v in vals))}
                mn, mx = torch.aminmax(x)
                xf = x.to(torch.float64)
                mean, norm = xf.sum() / n, torch.linalg.vector_norm(xf)
                return {"Max": mx.item(), "Min": mn.item(), "Mean": mean.item(), "Norm": norm.item()}
            if x.dtype.itemsize == 1:  # float8: few kernels take it
                x = x.float()
            flat = x.view(-1) if x.is_contiguous() else None
            mn, mx = torch.aminmax(x if flat is None else flat)
            if x.dtype in _LOW_FLOATS or flat is None:
                # fp16/bf16 summed in float64, as the C kernel and the device kernels do: float32 sums of
                # millions of elements drift by 1e-4 (and the CPU and GPU dumps would disagree)
                total = x.sum(dtype=torch.float64) if x.dtype in _LOW_FLOATS else x.sum()
                norm = torch.linalg.vector_norm(x, dtype=torch.float64 if x.dtype in _LOW_FLOATS else None)
                squared = False
            else:
                total, norm, squared = flat.sum(), torch.dot(flat, flat), True
            return _finish((mx.item(), mn.item(), total.item(), norm.item()), n, squared, x)


def _finish(vals, n, squared, x):
    mx, mn, total, norm = vals
    if squared:
        if x is not None and math.isinf(norm) and math.isfinite(mx) and math.isfinite(mn):
            norm = torch.linalg.vector_norm(x, dtype=torch.float64).item()  # the squares overflowed
        else:
            norm = math.sqrt(norm) if norm == norm else norm
    if x is not None and math.isinf(total) and math.isfinite(mx) and math.isfinite(mn):
        total = x.sum(dtype=torch.float64).item()
    mean = total / n
    if math.isfinite(mx) and math.isfinite(mn) and math.isfinite(mean) and math.isfinite(norm):
        return {"Max": mx, "Min": mn, "Mean": mean, "Norm": norm}
    return {"Max": json_float(mx), "Min": json_float(mn), "Mean": json_float(mean), "Norm": json_float(norm)}


def _memory_key(t):
    return (t.data_ptr(), t.dtype, t.shape, t.stride(), t.device)


def element_span(t):
    """((stride, size), ...) of `t` in memory order with size-1 dimensions dropped and a dimension
    merged into the one outside it when it steps over it exactly: equal for all views of the same
    elements (`x.chunk(3)[0].view(b, s, h, d).transpose(1, 2)` and the chunk itself)."""
    merged = []
    for stride, size in sorted(((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1), reverse=True):
        if merged and merged[-1][0] == stride * size:
            merged[-1] = (stride, merged[-1][1] * size)
        else:
            merged.append((stride, size))
    return tuple(merged)


def memory_order(x):
    """`x` with its dimensions permuted into memory order when that makes it contiguous (a transposed
    view): reductions then stream through memory. Other tensors are returned as they are."""
    if x.is_contiguous() or x.dim() < 2:
        return x
    order = sorted(range(x.dim()), key=lambda d: (-x.stride(d), -x.shape[d]))
    y = x.permute(order)
    return y if y.is_contiguous() else x


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


def _bytes_of(x_cpu):
    return x_cpu.reshape(-1).view(torch.uint8).numpy() if x_cpu.numel() else b""


def checksum_of(x_cpu):
    """wordsum64 of a CPU tensor's raw bytes as 16 hex digits (the "md5" field; core/checksum.py)."""
    return checksum_hex(_bytes_of(x_cpu))


def checksum_of_tensor(t):
    """wordsum64 of `t`'s bytes (CPU), read in place when `t` is contiguous."""
    x = host_view(t)
    n = x.numel()
    threads = torch.get_num_threads() if n >= _PARALLEL_MIN else 1
    nbytes = n * x.element_size()
    # the C kernel straight on the tensor's memory: numpy views cost more than the sum of a small tensor
    sums = wordsum(x.data_ptr(), nbytes, threads) if nbytes else None
    return finish(sums[0], sums[1], nbytes) if sums is not None else checksum_hex(_bytes_of(x), threads)

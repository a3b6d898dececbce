"""Tensor -> record: the entry point of the summaries. A CPU tensor's statistics and CRC-32 come at once
(host.py); anything else — tensors on an accelerator, and CPU tensors when `device_path` is set — is
summarised into device slots (device.py) that `start_resolve` brings to the host in one copy. Values seen
again unchanged reuse their record (cache.py), except a small dense host tensor's, read again each time
(cache.UNKEYED_MAX); the same tensor object seen again (same version, memory and shape) takes its record
from a per-object table before any key is built: the common case, an output passed straight to the next
API. Those two cases and a small dense CPU tensor's record are made in C
where msprobe._record is built (src/msprobe/_native/record.c: the same records and table entries).
Guarded by benchmarks/dump_overhead.py.
"""

import os
import weakref

import torch

from msprobe.core.dump import moments as native
from msprobe.pytorch.summary import cache as _cache, host, slots
from msprobe.pytorch.summary.cache import CACHE_LIMIT, CacheEntry, memory_key
from msprobe.pytorch.summary.device import _UNREAD, DeviceSummaries
from msprobe.pytorch.summary.layout import element_span, memory_order
from msprobe.pytorch.summary.slots import fill_from_slot
from msprobe.pytorch.tensor_subclasses import plain_tensor

_kernel = native.kernel  # the C statistics kernel (None when not built)
try:
    from msprobe._record import Recorder as _Recorder
except ImportError:  # built without a C compiler (or without msprobe._moments): records made in Python
    _Recorder = None

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_STRIDED = torch.strided
_DTYPE_NAMES = {}
_STAT_FIELDS = {"Max": None, "Min": None, "Mean": None, "Norm": None}
_STAT_MD5_FIELDS = dict(_STAT_FIELDS, md5=None)


def dtype_name(dtype):
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)  # 'torch.float32', as msProbe writes it
    return name


def _record_dict(name, shape, values, requires_grad):
    """A tensor's record in msProbe's field order: type, dtype (`name`), shape, the value fields,
    requires_grad (msprobe._record's `new_record` makes the same)."""
    return {"type": "torch.Tensor", "dtype": name, "shape": list(shape), **values, "requires_grad": requires_grad}


class Summarizer:
    """Computes tensor records; keeps a cache of recent results keyed by memory and version.

    A CPU tensor's statistics come at once from the C kernel (or torch's reductions); anything else
    — tensors on an accelerator, and CPU tensors when `device_path` is set — is summarised into
    device slots (device.py) that `start_resolve` brings to the host in one copy.
    The md5 checksum (CRC-32, core/checksum.py) is read in place on the CPU, in a slot elsewhere.

    Args:
        stats: compute Max/Min/Mean/Norm (False for the structure task).
        md5: add the CRC-32 of the tensor bytes under "md5" (8 hex digits, msProbe's value).
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
        self._deferral = self.slots._waiting
        # the deferred summaries not launched yet, truthy while any wait: asked before every call the
        # API mode passes on, as an attribute (the Deferral's own list, changed only in place)
        self.deferred = self._deferral.queue
        self._cache = {}
        # id(tensor) -> (weak ref, data_ptr, shape, record, cache entry): a tensor object summarised
        # before (an API's input is usually the previous API's output object) skips the memory key
        self._objects = {}
        self._native_kinds = host.NATIVE_KINDS if native.ENABLED and not device_path else {}
        self._unkeyed = 0 if device_path else _cache.UNKEYED_MAX  # (read here: tests set it)
        self._fields = _STAT_MD5_FIELDS if md5 and stats else ({"md5": None} if md5 else _STAT_FIELDS)
        self._nfields = len(self._fields)
        self.blank_fields = self._fields if (stats or md5) else {}  # a record's value fields, all null
        # sum_record's kernel: where a dense CPU float32 tensor's record comes from the host kernel
        self._sum_kernel = native.sum_kernel if stats and not md5 and not device_path else None
        self.entry = None  # the cache entry of the last record made (see summarize)
        # a forward value's record (`record(t)`): deferred, shared (the session sets them)
        self.defer_forward = False
        self.share_forward = False
        # record's common cases in C over the same tables (None: Python only; MSPROBE_NATIVE_RECORD=0 to compare);
        # on the device path only the object table's (a CPU tensor's first summary goes into a slot too)
        self._fast = None
        if _Recorder is not None and (stats or md5) and os.environ.get("MSPROBE_NATIVE_RECORD", "1") != "0":
            self._fast = _Recorder(self._objects, self._cache, _DTYPE_NAMES, self._native_kinds, torch.Tensor,
                                   torch.nn.Parameter, _STRIDED, CacheEntry, CACHE_LIMIT,
                                   0 if device_path else host.PARALLEL_MIN, torch.get_num_threads, stats,
                                   md5, self.slots, self._fields, slots.SLOTS_PER_BUFFER, self._unkeyed).record

    @property
    def reads_sums(self):
        """Whether `sum_record` may read a sum of parts in one pass here (else it always declines)."""
        return self._sum_kernel is not None

    def sum_record(self, parts):
        """The record of `parts[0] + parts[1] + ...` (gradients that reach one input by several edges),
        read in one pass without the sum in memory; None where that is not the case here (the caller adds
        them up and records the sum): plain dense CPU float32 tensors of one shape, statistics without
        md5, the host path. The numbers are the sum's own to the last bit: the kernel adds each element
        in float32 in this order, as torch does, and reads on the threads `record` would."""
        kernel = self._sum_kernel
        if kernel is None or not 1 < len(parts) <= native.SUM_MAX:
            return None
        shape = parts[0].shape
        for p in parts:
            if (type(p) is not torch.Tensor or p.dtype is not torch.float32 or p.layout is not _STRIDED
                    or not p.is_cpu or p.shape != shape or not p.is_contiguous()):
                return None
        n = parts[0].numel()
        if n < 2:
            return None
        got = kernel(tuple(p.data_ptr() for p in parts), n, torch.get_num_threads() if n >= host.PARALLEL_MIN else 1)
        if got is None:  # a NaN or inf: torch's reductions of the sum say how it shows
            return None
        requires_grad = torch.is_grad_enabled() and any(p.requires_grad for p in parts)
        return _record_dict(dtype_name(torch.float32), shape, native.stats_record(got), requires_grad)

    @property
    def native_record(self):
        """`record`'s C path, called as `native_record(self, t, shared, defer)` (None: not built or off)."""
        return self._fast

    @property
    def pending(self):
        """Summaries in device slots, not yet on the host (asked for every record: no nested property)."""
        return self.slots.pending

    @property
    def waiting(self):
        """Deferred summaries not launched yet (see DeviceSummaries); asked before every call the API
        mode passes on: no nested property or method."""
        return len(self._deferral.queue)

    def launch(self, touching=None):
        """Launch the deferred summaries now: something may change their tensors in place (`touching`:
        which tensors, when known; see DeviceSummaries.launch)."""
        if self.deferred:  # (every in-place call asks: no nested property)
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
                n = t.numel()
                # a dense tensor's key as summarize builds it (an in-place op's result: without memory_key's frame)
                key = ((t.data_ptr(), t.dtype, t.device, ((1, n),)) if n > 1 and t.is_contiguous()
                       else memory_key(t, n, self.md5)[0])
                hit = self._cache.pop(key, None)
                if hit is not None:  # other tensor objects on this memory (`p` after `p.data.add_`) miss too
                    hit.version = -1
            except (RuntimeError, NotImplementedError):
                pass

    def summarize(self, t, defer=False, shared=False):
        """(record, cache entry or None) of tensor `t`: see `record`. The entry's `file_for(t)` is where a
        tensor laid out as `t` was saved, if one was: the caller may link to it."""
        rec = self.record(t, defer, shared, keyed=True)
        return rec, self.entry

    def record(self, t, defer=None, shared=None, keyed=False):
        """Record for tensor `t` (fields still on the device are filled in when resolved); its cache
        entry is left in `self.entry`. `defer`: a device summary may wait for the next `launch()` (the
        caller launches before anything changes `t` in place); `shared`: the caller hands the record on
        unchanged, so a complete one is the same dict for every record of the same unchanged tensor
        (else a fresh dict the caller may extend). None: the session's `defer_forward` / `share_forward`
        (a forward value's record). `keyed`: `self.entry` is wanted (a small dense host tensor gets none
        otherwise: it is read again at each record, see cache.UNKEYED_MAX).

        (The hot path of every dump: attributes are read once, in one place.)
        """
        if defer is None:
            defer, shared = self.defer_forward, self.share_forward
        if self._fast is not None:
            rec = self._fast(self, t, shared, defer, keyed)  # None: not its case (nothing changed): on in Python
            if rec is not None:
                return rec
        tid = id(t)
        seen = self._objects.get(tid)
        # (the entry's version: `forget`, a change made through another tensor object, invalidates it)
        if (seen is not None and seen[0]() is t and seen[4].version == t._version and seen[1] == t.data_ptr()
                and seen[2] == t.shape):
            rec = seen[3]
            self.entry = entry = seen[4]
            # shared as it is (its fields still on the device filled in place when resolved)
            if rec["requires_grad"] is not t.requires_grad:
                rec = dict(rec, requires_grad=t.requires_grad)
            elif shared:
                return rec
            else:
                rec = rec.copy()
            for slot in entry.slots:  # a dict of its own: filled when resolved too
                fill_from_slot(rec, slot)
            return rec
        dtype = t.dtype
        try:
            name = _DTYPE_NAMES[dtype]
        except KeyError:
            name = dtype_name(dtype)
        if t.is_nested:  # (nn.TransformerEncoder's fast path in eval, with a padding mask)
            self.entry = None
            return self._nested_record(t, name)
        if not (self.stats or self.md5):  # structure task: nothing to compute, nothing to remember
            self.entry = None
            return _record_dict(name, t.shape, {}, t.requires_grad)
        key = span = storage = None
        n = t.numel()
        # plain tensors only: subclasses (fake, wrapper) may have no real memory to key on
        if type(t) in _PLAIN and t.layout is _STRIDED and not t.is_inference():
            try:
                if n > 1 and t.is_contiguous():
                    span = ((1, n),)
                    if n < self._unkeyed and not keyed and t.is_cpu:  # read again: no key, entry or row
                        self.entry = None
                        return _record_dict(name, t.shape, self._values_now(t, n, dtype, span), t.requires_grad)
                    key = (t.data_ptr(), dtype, t.device, span)
                else:
                    key, span = memory_key(t, n, self.md5)
                storage = t.untyped_storage()  # read once: the cache's liveness check and its entry
            except (RuntimeError, NotImplementedError):  # no storage (wrapper subclasses, fake tensors)
                key = None
        shape = t.shape
        version = t._version
        if key is not None:
            hit = self._cache.get(key)
            # the same storage, alive: the memory was not freed and reused by another tensor since (FSDP2
            # frees an unsharded parameter's memory by resizing its storage to 0, keeping the storage)
            if hit is not None and version == hit.version and hit.ref() is storage:
                self.entry = hit
                return self._record(t, name, shape, key, hit, hit.values, hit.slots, shared)
        values, slots = None, []
        if (t.is_cpu and not self.device_path) or n == 0:  # on the host, now
            values = self._values_now(t, n, dtype, span)
        else:
            values, slots = self._slots_of(t, n, span, _UNREAD if storage is None else storage.data_ptr(), defer)
        entry = None
        if key is not None:
            cache = self._cache
            if len(cache) > CACHE_LIMIT:
                cache.clear()
                self._objects.clear()  # its rows hang on the cache's entries (see forget)
            if hit is not None:  # replaced: a tensor object whose row holds it reads its memory again
                hit.version = -1
            try:
                entry = cache[key] = CacheEntry(weakref.ref(storage), version, values, slots)
            except TypeError:  # a storage without weak references
                entry = None
        self.entry = entry
        if slots or entry is None or len(values) != self._nfields:
            return self._record(t, name, shape, key, entry, values, slots, shared)
        # complete, remembered for the tensor object (_record's first case, inline: most records)
        rec = _record_dict(name, shape, values, t.requires_grad)
        objects = self._objects
        if len(objects) > CACHE_LIMIT:
            objects.clear()
        objects[tid] = (weakref.ref(t), key[0], shape, rec, entry)
        return rec if shared else rec.copy()

    def _record(self, t, name, shape, key, entry, values, slots, shared=False):
        """`t`'s record: its fields in msProbe's order (those still on the device null until their slots
        are resolved, filled in place: one dict per tensor, shared by its records); remembered for the
        tensor object when it has a cache entry. `shared`: see record."""
        rec = _record_dict(name, shape, values, t.requires_grad)
        for slot in slots:  # fields still on the device: this dict is filled when they are resolved
            fill_from_slot(rec, slot)
        if entry is not None:
            objects = self._objects
            if len(objects) > CACHE_LIMIT:
                objects.clear()
            objects[id(t)] = (weakref.ref(t), key[0], shape, rec, entry)
        if shared:
            return rec
        rec = rec.copy()
        for slot in slots:  # a dict of its own: filled when resolved too
            fill_from_slot(rec, slot)
        return rec

    def _nested_record(self, t, name):
        """A nested tensor's record: the statistics (and checksum) of its components' elements one
        after another, and the shape of the padded tensor it stands for (torch.nested.to_padded_tensor)."""
        parts = t.unbind()
        flat = (torch.cat([p.detach().reshape(-1) for p in parts]) if parts
                else torch.empty(0, dtype=t.dtype, device=t.device))
        shape = [len(parts)] + [max(p.shape[d] for p in parts) for d in range(t.dim() - 1)] if parts else [0]
        values = self._host_values(flat, flat.numel(), None) if (self.stats or self.md5) else {}
        return _record_dict(name, shape, values, t.requires_grad)

    def _values_now(self, t, n, dtype, span):
        """The value fields of host tensor `t` (n elements of `dtype`; `span`: element_span(t) when known)."""
        values = None
        if self.stats:
            kind = self._native_kinds.get(dtype)
            if (kind is not None and span is not None and n < host.PARALLEL_MIN and len(span) == 1
                    and span[0][0] == 1):
                # a small dense tensor (most of them): the C kernel straight, without statistics()'s frame
                got = _kernel(t.data_ptr(), n, kind, 1)
                if got is not None:
                    values = {"Max": got[0], "Min": got[1], "Mean": got[2], "Norm": got[3]}
        return self._host_values(t, n, span, values)

    def _host_values(self, t, n, span, values=None):
        """The value fields of tensor `t` (n elements) read on the host now: `values` (its statistics,
        when the caller read them) or host.statistics', and its CRC with md5 (into this call's own dict)."""
        if values is None:
            values = host.statistics(t, n, span, self._native_kinds) if self.stats else {}
        if self.md5:
            values["md5"] = host.crc32_of(t)
        return values

    def _slots_of(self, t, n, span, address, defer):
        """(values, slots) of tensor `t` (n elements) summarised into device slots: `values` is the dict of
        its fields, in msProbe's order, filled in place when the slots are resolved (before any record is
        written), shared by every record of this tensor. `span`: element_span(t) when known; `address`:
        its storage's (or _UNREAD); `defer`: see record. (msprobe._record calls it too.)"""
        if t.is_quantized or t.layout is not _STRIDED:  # no device kernel takes it (quantized, sparse): now
            return self._host_values(t, n, span), []
        # a tensor outside autograd is held (deferred) detached: autograd takes a gradient nobody else
        # holds as .grad and copies one that is held (a detach costs more than the rest of a deferral)
        x = t.detach() if defer and not t.requires_grad else t
        values = self._fields.copy()
        # contiguous: no more to look at
        dense = span is not None and len(span) == 1 and span[0] == (1, n) and not t.dtype.is_complex
        if dense and defer and self.md5 and self.stats:  # both summaries wait as one item
            return values, self.slots.stats_checksum(x, n, address, values)
        slots = []
        if self.stats:
            if dense:
                slots.append(self.slots.stats(x, n, x, defer, None, address, values))
            else:
                slots.append(self._stats_slot(x, n, span, defer, values))
        if self.md5:
            slots.append(self.slots.checksum(x, defer, address, values))
        return values, slots

    def _stats_slot(self, x, n, span, defer, fields):
        """A device slot of the Max/Min/Sum/Sum of squares of `x` (complex: of |x|), not contiguous or
        complex (summarize takes the rest), resolved into dict `fields`; `span`: element_span(x) when the
        caller has it."""
        if x.dtype.is_complex:
            with torch.no_grad():
                x = x.abs()
            span = None
        dense = memory_order(x)
        if dense.is_contiguous():
            return self.slots.stats(x, n, dense, defer, fields=fields)
        if span is None:
            span = element_span(x)
        # rows of a wider tensor (one chunk of a fused qkv projection), not overlapping
        rows = ((span[1][1], span[0][0]) if len(span) == 2 and span[1][0] == 1 and span[0][0] >= span[1][1]
                else None)
        return self.slots.stats(x, n, None, defer, rows, fields=fields)

    def _stats(self, t, n=None, span=None):
        """Max/Min/Mean/Norm of CPU tensor `t` now (host.py); `span` is `element_span(t)` when the caller has it."""
        return host.statistics(t, t.numel() if n is None else n, span, self._native_kinds)

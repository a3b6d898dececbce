"""MindSpore tensor -> record: Max/Min/Mean/Norm computed on the host (one pass of msprobe's C kernel
for float32/float64, numpy otherwise).

MindSpore's CPU build has no kernel for `mint.norm` (LinalgVectorNorm), which is why msProbe cannot
dump statistics on a CPU; here every statistic is a host reduction of `asnumpy()`, so nothing needs a
device kernel. Conventions shared with the PyTorch adapter (msprobe-facts §3.2): bool -> Max=any,
Min=all, Mean/Norm null; complex -> statistics of |x|; empty -> all null; float16/bfloat16 read as
float32. A tensor seen again in the same step (same object) reuses its statistics: an API's input is
usually the previous API's output. Reading `_version` to validate that would make MindSpore finish all
queued work (a spin-wait), so calls that work in place drop their tensors from the cache instead
(`forget`), and the cache lives for one step.

The kernel runs on one thread here, unlike in PyTorch (where its OpenMP team is torch's own, already
spinning): in a MindSpore process a second libgomp thread competes with MindSpore's own pool
(benchmarks/RESULTS.md, MindSpore design notes).
"""

import weakref

import mindspore as ms
import numpy as np

from msprobe.core.checksum import crc32_hex, crc32_hex_at, crc32_hex_strided
from msprobe.core.dump import moments as native
from msprobe.core.dump.deferral import Deferral
from msprobe.core.dump.json_append import json_float
from msprobe.mindspore import context_params

_CACHE_LIMIT = 4096
# dtypes numpy cannot hold: upcast exactly to float32 before asnumpy()
_UPCAST = tuple(d for d in (getattr(ms, "bfloat16", None),) if d is not None)
_NULL_STATS = {"Max": None, "Min": None, "Mean": None, "Norm": None}
# arrays the one-pass kernel reads (core/dump/moments.py); others, and inf/nan, go through numpy
_NATIVE_KINDS = {np.dtype(name): kind for name, kind in native.KINDS.items() if name != "bfloat16"} \
    if native.ENABLED else {}


def dtype_name(dtype):
    """'Float32', 'BFloat16', as msProbe writes it (str() of a MindSpore dtype costs more than a lookup)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


_DTYPE_NAMES = {}


def host_view(t):
    """`t` as a numpy array sharing its memory (bfloat16 -> a float32 copy, exact). Read it at once:
    a later in-place op changes it (a view costs nothing, a copy a pass over the tensor)."""
    if t.dtype in _UPCAST:
        t = t.astype(ms.float32)
    return np.asarray(t.asnumpy())


def host_array(t):
    """A numpy copy of `t` in its own dtype (bfloat16 -> float32, exact); safe from later in-place edits."""
    return host_view(t).copy()


def array_stats(a):
    """Max/Min/Mean/Norm of a numpy array as JSON-ready floats (or bools for bool arrays)."""
    if a.size == 0:
        return dict(_NULL_STATS)
    if a.dtype == np.bool_:
        return {"Max": bool(a.any()), "Min": bool(a.all()), "Mean": None, "Norm": None}
    if np.iscomplexobj(a):
        a = np.abs(a)
    flat = a.reshape(-1)
    if flat.dtype.kind in "iu":
        got = _kernel_stats(flat)  # (int64, int32; None: another, or a value beyond +-2^53)
        if got is not None:
            return got
        f64 = flat.astype(np.float64)
        return {"Max": flat.max().item(), "Min": flat.min().item(), "Mean": float(f64.mean()),
                "Norm": float(np.sqrt(np.dot(f64, f64)))}
    if flat.dtype == np.float16:
        flat = flat.astype(np.float32)
    with np.errstate(all="ignore"):  # inf/nan tensors are what an overflow hunt dumps
        return _float_stats(flat)


def _kernel_stats(flat):
    """The record fields of 1-d array `flat` from the one-pass kernel, or None: not a dtype it reads, or an
    inf/nan is in there (numpy says how it shows)."""
    kind = _NATIVE_KINDS.get(flat.dtype)
    if kind is not None and flat.flags.c_contiguous:
        got = native.moments(flat.__array_interface__["data"][0], flat.size, kind)
        if got is not None:
            return native.stats_record(got)
    return None


def _float_stats(flat):
    got = _kernel_stats(flat)
    if got is not None:
        return got
    return {"Max": json_float(float(flat.max())), "Min": json_float(float(flat.min())),
            "Mean": json_float(float(flat.mean())), "Norm": json_float(float(np.sqrt(np.dot(flat, flat))))}


def _tensor_getters():
    """(is_contiguous, data_ptr) as TensorPy's own functions: Tensor's methods are a Python frame
    around each, and every tensor summarised where it lies asks both."""
    try:
        from mindspore._c_expression import TensorPy
        return TensorPy.is_contiguous, TensorPy._data_ptr
    except (ImportError, AttributeError):
        return ms.Tensor.is_contiguous, ms.Tensor.data_ptr


_is_contiguous, _data_ptr = _tensor_getters()


def _direct_kinds():
    """MindSpore dtype -> numpy dtype, for tensors whose memory may be read where it lies: only when
    MindSpore runs on the CPU (elsewhere data_ptr() is device memory), float32/float64 only."""
    if not native.ENABLED or context_params.device_target() != "CPU":
        return {}
    return {ms.float32: np.dtype(np.float32), ms.float64: np.dtype(np.float64)}


def direct_moments(t, dt, address=None):
    """(Max, Min, Mean, Norm) of a CPU float tensor of numpy dtype `dt` (see _direct_kinds) read where
    it lies (data_ptr() waits for the op that makes it, as asnumpy() does), or None: empty, or inf/nan
    (array_stats then says how they show). asnumpy() builds an ndarray whose buffer format numpy
    parses each time, and copies a strided view (a chunk, a transpose) through MindSpore's thread
    pool, several times slower than this for small views. `address`: its data_ptr() when the caller
    read it and knows the tensor is contiguous."""
    n = t.size
    if not n:
        return None
    # (_direct_kinds is empty unless the kernel is enabled); one thread: a team of the kernel's own beside
    # MindSpore's thread pool slows the step's ops more than it saves (benchmarks/RESULTS.md)
    if address is not None:
        return native.kernel(address, n, _NATIVE_KINDS[dt], 1)
    if _is_contiguous(t):
        return native.kernel(_data_ptr(t), n, _NATIVE_KINDS[dt], 1)
    dense = _dense_copy(t, dt)
    return native.kernel(dense.__array_interface__["data"][0], n, _NATIVE_KINDS[dt], 1)


def direct_checksum(t, dt, address=None):
    """`checksum_of` a CPU tensor that `direct_moments` read (see there): its memory where it lies when
    it is contiguous (`address`: its data_ptr() when the caller read it), a view as its dense runs in
    index order (core/checksum.py), else a C-order copy."""
    if address is None and _is_contiguous(t):
        address = _data_ptr(t)
    if address is not None:
        return crc32_hex_at(address, t.size * dt.itemsize)
    got = crc32_hex_strided(_data_ptr(t), dt.itemsize, tuple(t.shape), tuple(t.stride()))
    return got if got is not None else checksum_of(_dense_copy(t, dt))


def _dense_copy(t, dt):
    """A C-order numpy copy of strided tensor `t`: the element order asnumpy() gives, so that the
    kernel's blocked sums come out the same."""
    return np.ascontiguousarray(np.asarray(_Memory(_data_ptr(t), tuple(t.shape), dt,
                                                   tuple(s * dt.itemsize for s in t.stride()))))


class _Memory:
    """Memory numpy may read where it lies (the array interface): no ctypes array type per size, which
    cost more than the read itself and left a reference cycle per type behind."""

    __slots__ = ("__array_interface__",)

    def __init__(self, address, shape, dtype, strides):
        self.__array_interface__ = {"data": (address, True), "shape": shape, "typestr": dtype.str,
                                    "strides": strides, "version": 3}


def checksum_of(a):
    """CRC-32 of the array's bytes in index order as 8 hex digits (the "md5" field, core/checksum.py;
    ISA-L on the array's memory when it is contiguous): msProbe's value, and PyTorch's adapter's for the
    same bytes."""
    return crc32_hex(np.ascontiguousarray(a).view(np.uint8).reshape(-1)) if a.size else crc32_hex(b"")


class Summarizer:
    """Computes tensor records; keeps a small identity cache of recent results.

    Args:
        stats: compute Max/Min/Mean/Norm (False for the structure task).
        md5: add the CRC-32 of the tensor bytes under "md5".
    """

    def __init__(self, stats=True, md5=False, late=None):
        self.stats = stats
        self.md5 = md5
        # tensors whose statistics wait for the next resolve (the session's Deferral, which summarises them)
        self._late = late if late is not None else Deferral(_nothing, 1)
        self._cache = {}
        self._aliases = {}  # id(HookBackward copy) -> (weakref to it, the tensor it copies)
        self._direct = _direct_kinds() if stats else {}  # see direct_moments

    @property
    def pending(self):
        """Tensors queued for the next resolve (read at every record)."""
        return len(self._late.queue)

    @property
    def waiting(self):
        """Tensors queued, not read yet (CaptureSession.before_mutation)."""
        return len(self._late)

    def reads_without_op(self, t, saved=False):
        """Whether `t` (a CPU tensor) is summarised without running a MindSpore op: a float32/float64
        tensor read where it lies in any layout (`direct_moments`, `direct_checksum`: its memory through
        data_ptr() and strides), or a contiguous one asnumpy() views; not bfloat16 (an upcast op), nor
        another dtype's strided view (asnumpy() makes it contiguous with a kernel). `saved`: its values
        are also copied for a tensor file (asnumpy(), so contiguous only)."""
        dtype = t.dtype
        if dtype in self._direct and not saved:
            return True
        return dtype not in _UPCAST and t.is_contiguous()

    def launch(self, touching=None):
        """Summarise the queued tensors now: something is about to change some of them in place (which
        ones does not matter: a read waits for MindSpore's whole pipeline anyway)."""
        self._late.launch()

    def start_resolve(self):
        """The queued tensors as a batch whose `finish()` summarises them (on the training thread: a
        MindSpore tensor is read where its ops run)."""
        return self._late.take()

    def clear(self):
        self._cache.clear()
        self._aliases.clear()

    def alias(self, new, old):
        """`new` holds the same values as `old` (a HookBackward identity): summarising it is
        summarising `old` (both may still be unread when this is called)."""
        try:
            self._aliases[id(new)] = (weakref.ref(new), old)
        except TypeError:
            pass

    def forget(self, tensors):
        """Drop the cached records of tensors a call is about to change in place."""
        for t in tensors:
            self._cache.pop(id(t), None)
            self._aliases.pop(id(t), None)

    def summarize(self, t, into=None, same=None):
        """(record, host view or None) for tensor `t`; the view (see host_view) is returned when it was
        made anyway, to be copied at once by a caller that keeps it. `into`: a dict the fields go
        into (it is the record returned), instead of a new one. `same`: a dict of the records of
        tensors read at this same moment, all alive, by (address, shape, dtype) of their memory: a
        contiguous tensor read where it lies takes the record of another object over that memory (a
        gradient two hooks see) instead of reading it again."""
        key = id(t)
        alias = self._aliases.get(key)
        if alias is not None and alias[0]() is t:
            rec, arr = self.summarize(alias[1], into)
            self._remember(t, dict(rec))
            return rec, arr
        hit = self._cache.get(key)
        if hit is not None and hit[0]() is t:
            if into is None:
                return dict(hit[1]), None
            into.update(hit[1])
            return into, None
        dtype = t.dtype
        dt = self._direct.get(dtype)
        where = address = None
        if dt is not None and same is not None and _is_contiguous(t):
            address = _data_ptr(t)
            where = (address, t.shape, dtype)
            seen = same.get(where)
            if seen is not None:
                self._remember(t, seen)
                if into is None:
                    return dict(seen), None
                into.update(seen)
                return into, None
        rec = {"type": "mindspore.Tensor", "dtype": _DTYPE_NAMES.get(dtype) or dtype_name(dtype),
               "shape": list(where[1] if where is not None else t.shape)}
        arr = None
        got = direct_moments(t, dt, address) if dt is not None else None
        if where is not None:
            same[where] = rec
        if got is not None:
            rec["Max"], rec["Min"], rec["Mean"], rec["Norm"] = got  # (native.stats_record, inline)
            if self.md5:
                rec["md5"] = direct_checksum(t, dt, address)
        elif self.stats or self.md5:
            # (a strided float view with inf/nan: copied from its memory, as asnumpy() would, with no op)
            arr = host_view(t) if dt is None or address is not None or _is_contiguous(t) else _dense_copy(t, dt)
            if self.stats:
                rec.update(array_stats(arr))
            if self.md5:
                rec["md5"] = checksum_of(arr)
        self._remember(t, rec)
        if into is None:
            return dict(rec), arr
        into.update(rec)
        return into, arr

    def _remember(self, t, rec):
        """Cache `rec` (kept: never handed out, a hit returns a copy) as the record of `t`."""
        cache = self._cache
        if len(cache) > _CACHE_LIMIT:
            cache.clear()
        try:
            cache[id(t)] = (weakref.ref(t), rec)
        except TypeError:  # not weak-referenceable: never cached
            pass

    def drop_aliases(self):
        """Forget which copy stands for which tensor (the links hold the originals alive)."""
        self._aliases.clear()


def _nothing(items):
    """The Deferral of a Summarizer without a session: nothing is ever queued into it."""

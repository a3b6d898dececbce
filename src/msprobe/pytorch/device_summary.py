"""Statistics and checksums of tensors computed where they live, read back in one copy per batch.

On an accelerator every read of a result (`.item()`, `.tolist()`, `.cpu()`) waits for the device to
finish all queued work, and a read per tensor turns a step from max(host, device) into host + device.
Here a tensor's summary goes into a *slot*: one row of a device buffer, filled by kernels queued on
the tensor's stream — (max, min, sum, sum of squares) in float64, or the checksum's two 32-bit word
sums (core/checksum.py). `start_resolve()` queues one non-blocking copy of every slot filled since the
last resolve; `Readback.finish()` waits for that copy (on a writer thread, for CUDA) and turns rows into
record fields.

Kernels: on CUDA with Triton importable (pytorch/triton_summary.py), one launch per batch of deferred
summaries of one dtype, or per tensor when it cannot wait; torch's own reductions elsewhere (NPU, CUDA
without Triton, and the CPU path the tests force with `MSPROBE_DEVICE_SUMMARY=1`): a few launches per
tensor, and for a batch of small deferred tensors a few launches in all (one concatenation, segment
reductions). Both give the numbers the host path gives: Mean and Norm of non-float64
data rounded to float32, NaN in Max/Min when a NaN is in the tensor.
Guarded by benchmarks/host_cost.py and tests/pytorch/test_device_summary.py.
"""

import math
import os

import numpy as np
import torch

from msprobe.core import checksum
from msprobe.core.dump.json_append import json_float

# slots per device buffer; a batch that fills one goes on in a second
SLOTS_PER_BUFFER = 4096
_TRITON_OFF = os.environ.get("MSPROBE_TRITON", "1") == "0"
# deferred summaries launched together once this many tensors (or bytes of them) wait
DEFER_TENSORS = 512
DEFER_BYTES = 256 << 20
# an in-place call sorts the waiting tensors by whether it changes their memory while this few wait
# (above, all are launched: the batch is large enough)
SHARE_CHECK_MAX = 32
_DEFER_OFF = os.environ.get("MSPROBE_DEFER_SUMMARY", "1") == "0"
# deferred tensors of at most this many elements (by device type) are reduced together with torch's
# reductions: one concatenation and segment reductions instead of five launches a tensor; on CPU the
# concatenation costs more than the launches it saves above a few thousand elements
GROUP_ELEMENTS = {"cpu": 2048}
GROUP_ELEMENTS_ELSEWHERE = 1 << 16
GROUP_TOTAL = 1 << 22  # elements per grouped reduction: float64 temporaries of 32 MB
_ROW_BYTES = {0: 32, 1: 16}  # a slot's row: float64 x 4 (statistics), int64 x 2 (checksum)

STATS, CHECKSUM = 0, 1


class Slot:
    """Where one tensor's summary lands: `values` once resolved; the records waiting to be filled."""

    __slots__ = ("kind", "buffer", "index", "n", "dtype", "nbytes", "values", "waiting")

    def __init__(self, kind, buffer, index, n, dtype, nbytes):
        self.kind, self.buffer, self.index, self.n, self.dtype, self.nbytes = kind, buffer, index, n, dtype, nbytes
        self.values = None
        self.waiting = []


class _Buffer:
    """SLOTS_PER_BUFFER rows on one device: float64 x 4 for statistics, int64 x 2 for checksums."""

    __slots__ = ("device", "kind", "rows", "used")

    def __init__(self, device, kind):
        self.device, self.kind = device, kind
        width, dtype = (4, torch.float64) if kind == STATS else (2, torch.int64)
        self.rows = torch.empty((SLOTS_PER_BUFFER, width), dtype=dtype, device=device)
        self.used = 0


def _triton_kernels(device):
    """pytorch/triton_summary when it can run on `device` (CUDA with Triton installed), else None."""
    if _TRITON_OFF or device.type != "cuda":
        return None
    try:
        from msprobe.pytorch import triton_summary
    except ImportError:  # no Triton: torch's reductions
        return None
    return triton_summary


class DeviceSummaries:
    """The slots of one session: filled on the device, resolved in batches.

    A summary asked for with `defer` is not launched at once: the tensor waits (a reference and its
    version counter) until `launch()`, which reduces every waiting tensor of one dtype in one kernel —
    on CUDA a launch per tensor is what a step's host time is made of. The caller must `launch()` before
    anything may change a waiting tensor in place (pytorch/session.py: an in-place call, naming what it
    changes, the optimizer); a tensor whose version moved anyway is counted in `changed` (its record
    shows the changed values).
    """

    def __init__(self):
        self._open = {}  # (device, kind) -> the buffer being filled
        self._batch = []  # slots filled since the last resolve, in order
        self._buffers = []  # buffers the batch wrote
        self._kernels = {}  # device -> triton_summary or None
        self._waiting = []  # deferred: (kind, tensor, n, slot, version, rows)
        self._waiting_bytes = 0
        self.changed = 0  # deferred tensors changed in place before they were read

    @property
    def pending(self):
        return len(self._batch)

    @property
    def waiting(self):
        """Deferred summaries not launched yet."""
        return len(self._waiting)

    def _defer(self, kind, x, n, slot, nbytes, rows=None):
        self._waiting.append((kind, x, n, slot, x._version, rows))
        self._waiting_bytes += nbytes
        if len(self._waiting) >= DEFER_TENSORS or self._waiting_bytes >= DEFER_BYTES:
            self.launch()

    def launch(self, touching=None):
        """Launch the deferred summaries: one kernel per (device, kind, dtype) with Triton, else torch's
        reductions (grouped where small). `touching`: the tensors about to change in place, when known
        (None or empty: unknown); then only the summaries of tensors sharing memory with them go, and
        the others keep waiting for a larger batch (an in-place call launches its own input's alone)."""
        waiting, kept = self._waiting, []
        if touching and len(waiting) <= SHARE_CHECK_MAX:
            waiting, kept = _split_by_memory(waiting, touching)
            if not waiting:
                return
        self._waiting = kept
        self._waiting_bytes = sum(w[1].numel() * w[1].element_size() for w in kept)
        groups = {}
        for kind, x, n, slot, version, rows in waiting:
            if x._version != version:
                self.changed += 1
            groups.setdefault((kind, x.device, x.dtype), (self._kernels_for(x.device), []))[1].append(
                (x, n, slot, rows))
        for (kind, _, _), (kernels, items) in groups.items():
            if kernels is None:
                (_torch_stats_many if kind == STATS else _torch_checksum_many)(items)
                continue
            outs = [slot.buffer.rows.data_ptr() + slot.index * _ROW_BYTES[kind] for _, _, slot, _ in items]
            if kind == STATS:
                kernels.stats_many([x for x, _, _, _ in items], [n for _, n, _, _ in items], outs,
                                   [r or (n, n) for _, n, _, r in items])
            else:
                kernels.wordsum_many([x for x, _, _, _ in items], outs)

    def _slot(self, kind, device, n, dtype, nbytes):
        key = (device, kind)
        buf = self._open.get(key)
        if buf is None or buf.used == SLOTS_PER_BUFFER:
            buf = self._open[key] = _Buffer(device, kind)
            self._buffers.append(buf)
        slot = Slot(kind, buf, buf.used, n, dtype, nbytes)
        buf.used += 1
        self._batch.append(slot)
        return slot

    def _kernels_for(self, device):
        k = self._kernels.get(device, False)
        if k is False:
            k = self._kernels[device] = _triton_kernels(device)
        return k

    def stats(self, x, n, dense, defer=False, rows=None):
        """Slot of Max/Min/Sum/Sum-of-squares of `x` (a detached, real tensor of `n` elements);
        `dense` is x's memory in element order (x itself, or a permutation that makes it contiguous),
        or None; `rows`: (columns, row stride) when x's memory is rows of a wider tensor (a chunk).
        `defer`: launched with others at the next `launch()`."""
        device = x.device
        slot = self._slot(STATS, device, n, x.dtype, 0)
        kernels = self._kernels_for(device)
        fused = kernels is not None and kernels.handles(x.dtype) and (dense is not None or rows is not None)
        if defer and not _DEFER_OFF and (fused or kernels is None):
            self._defer(STATS, dense if fused and dense is not None else x, n, slot, n * x.element_size(),
                        rows if dense is None else None)
        elif fused and dense is not None:
            kernels.stats(dense, n, slot.buffer.rows, slot.index)
        else:
            self._torch_stats(x, slot)
        return slot

    @staticmethod
    def _torch_stats(x, slot):
        row = slot.buffer.rows[slot.index]
        with torch.no_grad():
            if x.dtype == torch.bool:
                row.copy_(torch.stack((x.any(), x.all(), x.any(), x.any())))
                return slot
            if not x.is_floating_point() or x.dtype.itemsize == 1:  # ints, float8: exact in float64
                x = x.to(torch.float64)
            flat = x.reshape(-1)
            mn, mx = torch.aminmax(flat)
            # each result straight into its place in the row: five launches a tensor
            torch.stack((mx, mn), out=row[:2])
            torch.sum(flat, dim=0, dtype=torch.float64, out=row[2])
            torch.linalg.vector_norm(flat, dtype=torch.float64, out=row[3])
            row[3:].square_()

    def checksum(self, x, defer=False):
        """Slot of the wordsum64 checksum of `x`'s bytes in element order (`defer`: as in `stats`)."""
        nbytes = x.numel() * x.element_size()
        slot = self._slot(CHECKSUM, x.device, x.numel(), x.dtype, nbytes)
        raw = x.contiguous().reshape(-1).view(torch.uint8)
        kernels = self._kernels_for(x.device)
        # whole 32-bit words at a 4-byte boundary (a 16-bit slice may start between two)
        words = (raw.view(torch.int32) if kernels is not None and nbytes % 4 == 0 and raw.storage_offset() % 4 == 0
                 else None)
        if defer and not _DEFER_OFF and (words is not None or kernels is None):
            self._defer(CHECKSUM, words if words is not None else raw, nbytes, slot, nbytes)
        elif words is not None:
            kernels.wordsum(words, slot.buffer.rows, slot.index)
        else:
            self._torch_checksum(raw, slot)
        return slot

    @staticmethod
    def _torch_checksum(raw, slot):
        slot.buffer.rows[slot.index].copy_(wordsum_torch(raw))

    def start_resolve(self):
        """Launch what is deferred, queue the copy of every slot of the batch to the host; the batch
        starts anew."""
        if self._waiting:
            self.launch()
        batch, buffers = self._batch, self._buffers
        self._batch, self._buffers, self._open = [], [], {}
        copies = []
        for buf in buffers:
            rows = buf.rows[:buf.used]
            if rows.device.type == "cpu":
                copies.append((buf, rows, None))
                continue
            host = torch.empty(rows.shape, dtype=rows.dtype, pin_memory=True)
            host.copy_(rows, non_blocking=True)
            event = torch.cuda.Event() if rows.device.type == "cuda" else None
            if event is not None:
                event.record()
            copies.append((buf, host, event))
        return Readback(batch, copies)


class Readback:
    """A batch's slots on their way to the host."""

    __slots__ = ("batch", "copies")

    def __init__(self, batch, copies):
        self.batch, self.copies = batch, copies

    def finish(self):
        """Wait for the copies, set each slot's values and fill the records waiting for it."""
        arrays = {}
        for buf, host, event in self.copies:
            if event is not None:
                event.synchronize()
            elif host.device.type != "cpu":
                host = host.cpu()
            arrays[id(buf)] = host.numpy()
        stats = [slot for slot in self.batch if slot.kind == STATS]
        for slot, values in zip(stats, stats_values_many(stats, arrays)):
            slot.values = values
        for slot in self.batch:
            if slot.kind != STATS:
                row = arrays[id(slot.buffer)][slot.index]
                slot.values = {"md5": checksum.finish(int(row[0]), int(row[1]), slot.nbytes)}
            for rec in slot.waiting:
                rec.update(slot.values)
            slot.waiting = []
        self.batch = self.copies = None


def _split_by_memory(waiting, tensors):
    """(the waiting items whose tensor shares a storage with one of `tensors`, the others); all of them
    when a tensor has no storage to compare."""
    try:
        changing = {t.untyped_storage().data_ptr() for t in tensors}
        shared = [w[1].untyped_storage().data_ptr() in changing for w in waiting]
    except (RuntimeError, NotImplementedError, TypeError):
        return waiting, []
    return [w for w, s in zip(waiting, shared) if s], [w for w, s in zip(waiting, shared) if not s]


def _grouped(items, fits):
    """`items` (x, n, slot, rows) split into chunks to reduce together (small ones, at most GROUP_TOTAL
    elements a chunk) and the rest, one by one."""
    x0 = items[0][0]
    limit = GROUP_ELEMENTS.get(x0.device.type, GROUP_ELEMENTS_ELSEWHERE)
    chunks, alone, chunk, total = [], [], [], 0
    for item in items:
        n = item[1]
        if n > limit or len(items) == 1 or not fits(item):
            alone.append(item)
            continue
        if total + n > GROUP_TOTAL:
            chunks.append(chunk)
            chunk, total = [], 0
        chunk.append(item)
        total += n
    if len(chunk) > 1:
        chunks.append(chunk)
    else:
        alone.extend(chunk)
    return chunks, alone


def to_device_async(host, device):
    """CPU tensor `host` on `device`, copied from pinned memory without waiting for the device's queue
    (`torch.tensor(values, device=...)` waits for it, as a read-back does)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _index_tensor(values, device):
    return to_device_async(torch.tensor(values, dtype=torch.int64), device)


def _store_rows(slots, values):
    """Row i of `values` into slot i's row of its buffer: one indexed copy per buffer."""
    by_buffer = {}
    for i, slot in enumerate(slots):
        _, rows, picks = by_buffer.setdefault(id(slot.buffer), (slot.buffer, [], []))
        rows.append(slot.index)
        picks.append(i)
    device = values.device
    for buf, rows, picks in by_buffer.values():
        part = values if len(picks) == len(slots) else values[_index_tensor(picks, device)]
        buf.rows.index_copy_(0, _index_tensor(rows, device), part)


def _torch_stats_many(items):
    """Statistics of deferred tensors of one device and dtype with torch's reductions: the small ones
    concatenated (as float64, exact for every real dtype) and reduced by segment; segment_reduce where a
    device lacks it falls back to a tensor at a time."""
    chunks, alone = _grouped(items, lambda item: True)
    for chunk in chunks:
        try:
            with torch.no_grad():
                lengths = _index_tensor([n for _, n, _, _ in chunk], chunk[0][0].device)
                flat = torch.cat([x.reshape(-1) for x, _, _, _ in chunk]).to(torch.float64)
                # unsafe: the lengths are right by construction, and checking them reads them back
                values = torch.stack([torch.segment_reduce(flat, op, lengths=lengths, unsafe=True)
                                      for op in ("max", "min", "sum")]
                                     + [torch.segment_reduce(flat * flat, "sum", lengths=lengths, unsafe=True)], dim=1)
        except (RuntimeError, NotImplementedError):
            alone.extend(chunk)
            continue
        _store_rows([slot for _, _, slot, _ in chunk], values)
    for x, _, slot, _ in alone:
        DeviceSummaries._torch_stats(x, slot)


def _torch_checksum_many(items):
    """Checksums of deferred flat uint8 tensors of one device: those of whole 32-bit words concatenated,
    each word keyed by its index in its own tensor, summed by segment (index_add_)."""
    chunks, alone = _grouped([(raw, raw.numel() // 4, slot, None) for raw, _, slot, _ in items],
                             lambda item: item[0].numel() % 4 == 0 and item[0].storage_offset() % 4 == 0)
    for chunk in chunks:
        device = chunk[0][0].device
        total = sum(n for _, n, _, _ in chunk)
        try:
            with torch.no_grad():
                lengths = _index_tensor([n for _, n, _, _ in chunk], device)
                starts = (torch.cumsum(lengths, 0) - lengths).to(torch.int32)
                words = torch.cat([raw.view(torch.int32) for raw, _, _, _ in chunk])
                # output_size: repeat_interleave would read the lengths back to size its output
                idx = _word_index(total, 0, device).sub_(torch.repeat_interleave(starts, lengths, output_size=total))
                a, b = _wordsum_terms(words, idx)
                segment = torch.repeat_interleave(torch.arange(len(chunk), device=device), lengths, output_size=total)
                sums = torch.zeros((len(chunk), 2), dtype=torch.int64, device=device)
                sums.index_add_(0, segment, torch.stack((a, b), dim=1).to(torch.int64))
        except (RuntimeError, NotImplementedError):  # an op the device lacks: a tensor at a time
            alone.extend(chunk)
            continue
        _store_rows([slot for _, _, slot, _ in chunk], sums & 0xFFFFFFFF)
    for raw, _, slot, _ in alone:
        DeviceSummaries._torch_checksum(raw, slot)


_FLT_MAX = 3.4028234663852886e38


def stats_values_many(slots, arrays):
    """Record fields of many statistics slots: the arithmetic in numpy, one dict per slot."""
    if not slots:
        return []
    rows = np.stack([arrays[id(s.buffer)][s.index] for s in slots])
    n = np.array([s.n for s in slots], dtype=np.float64)
    with np.errstate(all="ignore"):
        mean = rows[:, 2] / n
        norm = np.sqrt(rows[:, 3])
        # float32 precision for non-float64 floats, as the host kernel reports them (within float32's range)
        low = np.array([s.dtype.is_floating_point and s.dtype != torch.float64 for s in slots])
        for col in (mean, norm):
            fits = low & (np.abs(col) <= _FLT_MAX)
            col[fits] = col[fits].astype(np.float32)
        finite = np.isfinite(rows).all(axis=1)
    out = []
    for s, (mx, mn, _, _), m, nm, ok in zip(slots, rows.tolist(), mean.tolist(), norm.tolist(), finite.tolist()):
        dtype = s.dtype
        if dtype == torch.bool:
            out.append({"Max": bool(mx), "Min": bool(mn), "Mean": None, "Norm": None})
        elif ok:
            if not dtype.is_floating_point:
                mx, mn = int(mx), int(mn)
            out.append({"Max": mx, "Min": mn, "Mean": m, "Norm": nm})
        else:
            if mx != mx or mn != mn:  # a NaN: torch's max and min say nan
                mx = mn = float("nan")
            elif not dtype.is_floating_point and math.isfinite(mx) and math.isfinite(mn):
                mx, mn = int(mx), int(mn)
            out.append({"Max": json_float(mx), "Min": json_float(mn), "Mean": json_float(m), "Norm": json_float(nm)})
    return out


def stats_values(row, n, dtype):
    """Record fields from one slot's row (max, min, sum, sum of squares)."""
    one = Slot(STATS, None, 0, n, dtype, 0)
    return stats_values_many([one], {id(None): np.asarray(row, dtype=np.float64).reshape(1, 4)})[0]


def wordsum_torch(raw):
    """The checksum's (S1, S2) of a flat uint8 tensor, in torch ops on its device (the kernel where
    Triton is not at hand)."""
    n = raw.numel()
    pad = (-n) % 4
    if pad or raw.storage_offset() % 4:  # whole words from a 4-byte boundary: a fresh copy
        raw = torch.cat((raw, raw.new_zeros(pad)))
    words = raw.view(torch.int32)
    out = torch.zeros(2, dtype=torch.int64, device=raw.device)
    chunk = 1 << 24  # bounds the temporaries
    for start in range(0, words.numel(), chunk):
        w = words[start:start + chunk]
        a, b = _wordsum_terms(w, _word_index(w.numel(), start, raw.device))
        out += torch.stack((a.sum(dtype=torch.int64), b.sum(dtype=torch.int64)))
    return out & 0xFFFFFFFF


def _word_index(n, start, device):
    """Word indexes start .. start + n - 1 mod 2^32, as int32."""
    first = start & 0xFFFFFFFF
    return torch.arange(n, dtype=torch.int32, device=device).add_(first - (1 << 32) if first >> 31 else first)


def _wordsum_terms(words, idx):
    """The checksum's per-word terms (a, b) of int32 `words` at int32 word indexes `idx` (overwritten).
    32-bit arithmetic in int32: products wrap as uint32's do (the keys are below 2^31), right shifts are
    made logical by a mask, and a sum of the signed terms is the unsigned one mod 2^32."""
    a = idx.mul_(checksum.K0).bitwise_xor_(words)
    a ^= (a >> 16) & 0xFFFF
    a.mul_(checksum.K1)
    a ^= (a >> 15) & 0x1FFFF
    a.mul_(checksum.K2)
    a ^= (a >> 16) & 0xFFFF
    b = a * checksum.K3
    b ^= (b >> 13) & 0x7FFFF
    return a, b

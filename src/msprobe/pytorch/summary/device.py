"""Statistics and checksums of tensors computed where they live, read back in one copy per batch.

On an accelerator every read of a result (`.item()`, `.tolist()`, `.cpu()`) waits for the device to
finish all queued work, and a read per tensor turns a step from max(host, device) into host + device.
Here a tensor's summary goes into a slot (slots.py) filled by kernels queued on the tensor's stream;
`start_resolve()` queues one non-blocking copy of every slot filled since the last resolve, and
`Readback.finish()` (readback.py) waits for it (on a writer thread, for CUDA) and turns rows into fields.

Kernels: Triton's on CUDA when importable (triton_kernels.py), one launch per batch of deferred
summaries of one dtype; torch's elsewhere (torch_kernels.py: NPU, CUDA without Triton, and the CPU path
the tests force with `MSPROBE_DEVICE_SUMMARY=1`). Both give the numbers the host path gives.
Guarded by benchmarks/host_cost.py and tests/pytorch/test_device_summary.py.
"""

import os

import torch

from msprobe.core.dump.deferral import Deferral
from msprobe.pytorch.summary import readback, slots, torch_kernels
from msprobe.pytorch.summary.slots import CHECKSUM, STATS, Buffer, Slot

_TRITON_OFF = os.environ.get("MSPROBE_TRITON", "1") == "0"
# deferred summaries launched together once this many tensors (or bytes of them) wait
DEFER_TENSORS = 512
DEFER_BYTES = 256 << 20
# an in-place call sorts the waiting tensors by whether it changes their memory while this few wait
# (above, all are launched: the batch is large enough)
SHARE_CHECK_MAX = 32
_DEFER_OFF = os.environ.get("MSPROBE_DEFER_SUMMARY", "1") == "0"


def _triton_kernels(device):
    """triton_kernels when it can run on `device` (CUDA with Triton installed), else None."""
    if _TRITON_OFF or device.type != "cuda":
        return None
    try:
        from msprobe.pytorch.summary import triton_kernels
    except ImportError:  # no Triton: torch's kernels
        return None
    return triton_kernels


class DeviceSummaries:
    """The slots of one session: filled on the device, resolved in batches.

    A summary asked for with `defer` is not launched at once: the tensor waits (a reference and its
    version counter) in a Deferral (core/dump/deferral.py) until `launch()`, which reduces every waiting
    tensor of one dtype in one kernel —
    on CUDA a launch per tensor is what a step's host time is made of. The caller must `launch()` before
    anything may change a waiting tensor in place (pytorch/session.py: an in-place call, naming what it
    changes, the optimizer); a tensor whose version moved anyway is counted in `changed` (its record
    shows the changed values).
    """

    def __init__(self):
        self._open = {}  # (device, kind) -> the buffer being filled
        self._batch = []  # slots filled since the last resolve, in order
        self._buffers = []  # buffers the batch wrote
        self._kernels = {}  # device -> triton_kernels or None
        # deferred: (kind, kernels, item, tensor, version)
        self._waiting = Deferral(self._launch, DEFER_TENSORS, DEFER_BYTES, _launched_first)
        self.changed = 0  # deferred tensors changed in place before they were read

    @property
    def pending(self):
        return len(self._batch)

    @property
    def waiting(self):
        """Deferred summaries not launched yet."""
        return len(self._waiting)

    def _defer(self, kind, kernels, item, nbytes):
        x = item[0]
        if self._waiting.add((kind, kernels, item, x, x._version), nbytes):
            self.launch()

    def launch(self, touching=None):
        """Launch the deferred summaries: one batch per (kind, kernels, device, dtype). `touching`: the
        tensors about to change in place, when known (None or empty: unknown); then only the summaries of
        tensors sharing memory with them go, and the others keep waiting for a larger batch (an in-place
        call launches its own input's alone)."""
        self._waiting.launch(touching)

    def _launch(self, waiting):
        groups = {}
        for kind, kernels, item, x, version in waiting:
            if x._version != version:
                self.changed += 1
            groups.setdefault((kind, id(kernels), x.device, x.dtype), (kind, kernels, []))[2].append(item)
        for kind, kernels, items in groups.values():
            (kernels.statistics if kind == STATS else kernels.checksum)(items)

    def _slot(self, kind, device, n, dtype, nbytes):
        key = (device, kind)
        buf = self._open.get(key)
        if buf is None or buf.used == slots.SLOTS_PER_BUFFER:
            buf = self._open[key] = Buffer(device, kind)
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
        if fused:
            item = (dense, n, slot, None) if dense is not None else (x, n, slot, rows)
        else:
            item, kernels = (x, n, slot, None), torch_kernels
        # without Triton everything may wait; with it, only what its kernel reads
        if defer and not _DEFER_OFF and (fused or self._kernels_for(device) is None):
            self._defer(STATS, kernels, item, n * x.element_size())
        else:
            kernels.statistics([item])
        return slot

    def checksum(self, x, defer=False):
        """Slot of the raw CRC-32 of `x`'s bytes in element order (`defer`: as in `stats`)."""
        nbytes = x.numel() * x.element_size()
        slot = self._slot(CHECKSUM, x.device, x.numel(), x.dtype, nbytes)
        raw = x.contiguous().reshape(-1).view(torch.uint8)
        kernels = self._kernels_for(x.device) or torch_kernels
        if defer and not _DEFER_OFF:
            self._defer(CHECKSUM, kernels, (raw, slot), nbytes)
        else:
            kernels.checksum([(raw, slot)])
        return slot

    def start_resolve(self):
        """Launch what is deferred, queue the copy of every slot of the batch to the host; the batch
        starts anew."""
        if self._waiting:
            self.launch()
        batch, buffers = self._batch, self._buffers
        self._batch, self._buffers, self._open = [], [], {}
        return readback.start(batch, buffers)


def _launched_first(waiting, touching):
    """(the waiting items an in-place change of `touching` may reach, the others): sorted while few wait,
    above SHARE_CHECK_MAX all go (the batch is large enough)."""
    if len(waiting) > SHARE_CHECK_MAX:
        return waiting, []
    return _split_by_memory(waiting, touching)


def _split_by_memory(waiting, tensors):
    """(the waiting items whose tensor shares a storage with one of `tensors`, the others); all of them
    when a tensor has no storage to compare."""
    try:
        changing = {t.untyped_storage().data_ptr() for t in tensors}
        shared = [w[3].untyped_storage().data_ptr() in changing for w in waiting]
    except (RuntimeError, NotImplementedError, TypeError):
        return waiting, []
    return [w for w, s in zip(waiting, shared) if s], [w for w, s in zip(waiting, shared) if not s]

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
from torch._C import DisableTorchFunction

from msprobe.core.dump.deferral import Deferral
from msprobe.pytorch.summary import readback, slots, torch_kernels
from msprobe.pytorch.summary.slots import CHECKSUM, STATS, Buffer

_TRITON_OFF = os.environ.get("MSPROBE_TRITON", "1") == "0"
# deferred summaries launched together once this many tensors (or bytes of them) wait
DEFER_TENSORS = 512
DEFER_BYTES = 256 << 20
# an in-place call sorts the waiting tensors by whether it changes their memory while this few wait
# (above, all are launched: the batch is large enough)
SHARE_CHECK_MAX = 32
# torch's kernels: a small tensor whose summary must be taken now (not deferred, or about to change in
# place) is copied into a row of its lane's staging buffer of its dtype and shape instead — one copy into
# a view made once, not five launches — and the stage is reduced along its rows at the next full launch
STAGE_ELEMENTS = 1 << 20  # elements a staging buffer holds at most
STAGE_ROWS = 256  # rows a staging buffer holds at most
# staging buffers (and elements in them) a lane keeps; beyond (shapes that keep changing), all are launched
# and made anew
STAGES_PER_LANE = 64
STAGE_TOTAL = 1 << 22
STAGE_PICK = 8  # a launch of at most this many waiting tensors stages the small ones
_STAGED = -1  # a stage's storage address in the queue: no in-place call reaches a copy of msprobe's own
# a deferred item holding both summaries of one tensor (statistics and checksum): one item, split at launch
BOTH = 2
_UNREAD = object()  # a storage address the caller has not read
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
    changes, the optimizer, the end of a backward pass); a tensor whose version moved anyway is counted
    in `changed` (its record shows the changed values).
    """

    def __init__(self):
        self._lanes = {}  # device -> _Lane: its kernels and the buffers being filled
        self._buffers = []  # buffers the batch wrote, in the order they were opened
        self.pending = 0  # slots in them (read for every record: a plain attribute)
        # deferred: (group, item, tensor, version, storage address); group: (kind, kernels, dtype) of one lane
        # (kind BOTH: item is (statistics item, checksum item)); a staging buffer waits as (stage, None, None,
        # 0, _STAGED)
        self._waiting = Deferral(self._launch, DEFER_TENSORS, DEFER_BYTES, _launched_first)
        # the storage addresses of the waiting tensors (None: one has none): an in-place call on other
        # memory (most of them) is told so without a look at the waiting items
        self._memory = set()
        self.changed = 0  # deferred tensors changed in place before they were read
        self._touching = False  # a launch for an in-place change of known tensors is under way
        self.freed = 0  # deferred tensors whose memory was freed or replaced before they were read (not read)

    @property
    def waiting(self):
        """Deferred summaries not launched yet."""
        return len(self._waiting)

    def launch(self, touching=None):
        """Launch the deferred summaries: one batch per (kind, kernels, device, dtype). `touching`: the
        tensors about to change in place, when known (None or empty: unknown); then only the summaries of
        tensors sharing memory with them go, and the others keep waiting for a larger batch (an in-place
        call launches its own input's alone; on torch's lanes a few small ones are staged instead)."""
        if not self.touches(touching):
            return
        self._touching = bool(touching)
        try:
            self._waiting.launch(touching)
        finally:
            self._touching = False

    def touches(self, touching):
        """Whether changing `touching` in place may change a waiting summary's tensor: True unless
        every one of them has memory nothing waits for (None or empty: not known, True)."""
        if touching and None not in self._memory:
            memory = self._memory
            try:
                with DisableTorchFunction():  # (msprobe's own reads: no mode, the user's either, sees them)
                    for t in touching:
                        if t.untyped_storage().data_ptr() in memory:
                            return True
                return False
            except (RuntimeError, NotImplementedError, TypeError):  # no storage to compare: the long way
                pass
        return True

    def _launch(self, waiting):
        if self._touching and len(waiting) <= STAGE_PICK:
            waiting = self._stage_waiting(waiting)
        groups, staged = {}, []
        for group, item, x, version, storage in waiting:
            if x is None:  # a staging buffer (group): its rows reduced together
                staged.append(group)
                continue
            if storage is not None and _gone(x, storage):
                self._lose(group, item)
                continue
            if x._version != version:
                self.changed += 1
            if group[0] == BOTH:  # (statistics item, checksum item): each joins its kind's batch
                stats_item, crc_item = item
                _, kernels, dtype = group
                items = groups.get((STATS, kernels, dtype))
                if items is None:
                    groups[(STATS, kernels, dtype)] = [stats_item]
                else:
                    items.append(stats_item)
                group, item = (CHECKSUM, kernels, dtype), crc_item
            items = groups.get(group)
            if items is None:
                groups[group] = [item]
            else:
                items.append(item)
        for (kind, kernels, _), items in groups.items():
            (kernels.statistics if kind == STATS else kernels.checksum)(items)
        if staged:
            # staged rows are launched all at once (no in-place call selects one): each stage from its start
            torch_kernels.row_statistics([(stage.rows[:stage.used], stage.slots) for stage in staged])
            for stage in staged:  # launched: free for the next tensors of its shape, of any session
                lane = self._lanes[stage.rows.device]
                if lane.stages.pop(stage.key, None) is not None:
                    lane.staged -= stage.rows.numel()
                _give_back(stage)
        # what still waits (kept by a selective launch, or staged just now)
        self._memory = {pair[0][4] for pair in self._waiting.queue}

    def _lose(self, group, item):
        """A waiting item whose tensor's memory is gone: not read, its fields resolve to null."""
        self.freed += 1
        if group[0] == BOTH:
            slots.lose(item[0][2])
            slots.lose(item[1][1])
        else:
            slots.lose(item[2] if group[0] == STATS else item[1])

    def _stage_waiting(self, waiting):
        """The few waiting items about to change in place: the small ones on torch's lanes are copied into
        staging (they keep waiting there); the others are returned, to launch now."""
        go = []
        for w in waiting:
            group, item, x, version, storage = w
            lane = self._lanes.get(x.device) if x is not None and group[0] == STATS else None
            if lane is None or lane.kernels is not None or item[1] > lane.stage_max:
                go.append(w)  # (the launch looks at it)
                continue
            if storage is not None and _gone(x, storage):
                self._lose(group, item)
                continue
            if x._version != version:
                self.changed += 1
            self._stage(lane, x, item[1], item[2])
        return go

    def _stage(self, lane, x, n, slot):
        """Copy `x` (n elements, any layout) into the next row of `lane`'s staging buffer of its dtype and
        shape; its statistics go into `slot` with the stage's batch (the stage waits as one item, from
        its first row)."""
        key = (x.dtype, x.shape)
        stage = lane.stages.get(key)
        if stage is None:
            stage = _take_stage(lane.device, key, n)
            if len(lane.stages) >= STAGES_PER_LANE or lane.staged + stage.rows.numel() > STAGE_TOTAL:
                self.launch()  # everything, the stages too: they start over
                lane.stages.clear()
                lane.staged = 0
            lane.stages[key] = stage
            lane.staged += stage.rows.numel()
        k = stage.used
        # (detached: a copy from a tensor that requires grad would put the stage in the graph)
        stage.views[k].copy_(x.detach() if x.requires_grad else x)
        stage.used = k + 1
        stage.slots.append(slot)
        if k == 0 and self._waiting.add((stage, None, None, 0, _STAGED)) or k + 1 == len(stage.views):
            self.launch()

    def _lane(self, device):
        lane = self._lanes.get(device)
        if lane is None:
            lane = self._lanes[device] = _Lane(device, _triton_kernels(device))
        return lane

    def _open(self, lane, kind):
        """A new buffer of `kind` for `lane`'s slots (the one open is full, or none is)."""
        buf = lane.open[kind] = Buffer(lane.device, kind)
        self._buffers.append(buf)
        return buf

    def _slot(self, lane, kind, n, dtype, nbytes, fields):
        """A new slot of `kind` in `lane`'s open buffer (Buffer.slot)."""
        buf = lane.open[kind]
        if buf is None or buf.used == slots.SLOTS_PER_BUFFER:
            buf = self._open(lane, kind)
        return buf.slot(n, dtype, nbytes, fields)

    def stats(self, x, n, dense, defer=False, rows=None, storage=_UNREAD, fields=None):
        """Slot of Max/Min/Sum/Sum-of-squares of `x` (a real tensor of `n` elements); `dense` is x's
        memory in element order (x itself, or a permutation that makes it contiguous), or None; `rows`:
        (columns, row stride) when x's memory is rows of a wider tensor (a chunk); `storage`: the address
        of x's storage when the caller has read it; `fields`: the dict its record fields go into when
        resolved (Buffer.slot). `defer`: launched with others at the next `launch()`."""
        dtype = x.dtype
        lane = self._lanes.get(x.device) or self._lane(x.device)
        slot = self._slot(lane, STATS, n, dtype, 0, fields)
        self.pending += 1
        kernels = lane.kernels
        if kernels is None:  # torch's kernels read any layout
            item = (x, n, slot, None)
            kernels = torch_kernels
            if not defer and not _DEFER_OFF and n <= lane.stage_max:
                self._stage(lane, x, n, slot)
                return slot
        elif kernels.handles(dtype) and (dense is not None or rows is not None):
            item = (dense, n, slot, None) if dense is not None else (x, n, slot, rows)
        else:  # Triton's kernels cannot read it: torch's, at once
            torch_kernels.statistics([(x, n, slot, None)])
            return slot
        if defer and not _DEFER_OFF:
            if storage is _UNREAD:
                storage = _storage(x)
            self._memory.add(storage)
            group = (STATS, kernels, dtype)
            if dense is x and dtype not in lane.fast:  # msprobe._record defers the next such tensor itself
                lane.fast[dtype] = (group, dtype.itemsize)
            if self._waiting.add((group, item, x, x._version, storage), n * dtype.itemsize):
                self.launch()
        else:
            kernels.statistics([item])
        return slot

    def stats_checksum(self, x, n, storage=_UNREAD, fields=None):
        """[statistics slot, checksum slot] of contiguous real `x` (n elements), deferred as one item
        (`storage`, `fields`: as in `stats`); each summary joins its kind's batch at the launch."""
        dtype = x.dtype
        lane = self._lanes.get(x.device) or self._lane(x.device)
        kernels = lane.kernels
        if _DEFER_OFF or (kernels is not None and not kernels.handles(dtype)):
            return [self.stats(x, n, x, True, None, storage, fields), self.checksum(x, True, storage, fields)]
        kernels = kernels or torch_kernels
        fields = {} if fields is None else fields  # (one dict: both fill the same record fields)
        nbytes = n * dtype.itemsize
        stats_slot = self._slot(lane, STATS, n, dtype, 0, fields)
        crc_slot = self._slot(lane, CHECKSUM, n, dtype, nbytes, fields)
        self.pending += 2
        if storage is _UNREAD:
            storage = _storage(x)
        self._memory.add(storage)
        item = ((x, n, stats_slot, None), (x, crc_slot))
        group = (BOTH, kernels, dtype)
        if dtype not in lane.fast_md5:  # msprobe._record defers the next such tensor itself
            lane.fast_md5[dtype] = (group, dtype.itemsize)
        if self._waiting.add((group, item, x, x._version, storage), nbytes):
            self.launch()
        return [stats_slot, crc_slot]

    def checksum(self, x, defer=False, storage=_UNREAD, fields=None):
        """Slot of the raw CRC-32 of `x`'s bytes in element order (`defer`, `storage`, `fields`: as in
        `stats`)."""
        dtype = x.dtype
        if dtype.is_complex and (x.is_conj() or x.is_neg()):
            x = x.resolve_conj().resolve_neg()  # the bytes of the values, not of the lazy view
        n = x.numel()
        nbytes = n * x.element_size()
        lane = self._lanes.get(x.device) or self._lane(x.device)
        slot = self._slot(lane, CHECKSUM, n, dtype, nbytes, fields)
        self.pending += 1
        kernels = lane.kernels or torch_kernels
        if defer and not _DEFER_OFF:
            if storage is _UNREAD:
                storage = _storage(x)
            self._memory.add(storage)
            if self._waiting.add(((CHECKSUM, kernels, dtype), (x, slot), x, x._version, storage), nbytes):
                self.launch()
        else:
            kernels.checksum([(x, slot)])
        return slot

    def start_resolve(self):
        """Launch what is deferred, queue the copy of every slot of the batch to the host; the batch
        starts anew."""
        if self._waiting:
            self.launch()
        buffers = self._buffers
        self._buffers, self.pending = [], 0
        for lane in self._lanes.values():
            lane.open = [None, None]
        return readback.start(buffers)


class _Lane:
    """One device's kernels (Triton's, or None: torch's) and its open buffer of each kind."""

    __slots__ = ("device", "kernels", "open", "stages", "staged", "stage_max", "fast", "fast_md5")

    def __init__(self, device, kernels):
        self.device, self.kernels = device, kernels
        self.open = [None, None]  # by kind: STATS, CHECKSUM
        # dtype -> ((STATS, kernels, dtype), itemsize): dtypes whose contiguous tensors these kernels read
        # deferred as they are; msprobe._record queues such a tensor's statistics itself (record.c, defer_dense);
        # `fast_md5`: the same for statistics and checksum as one item ((BOTH, kernels, dtype), itemsize)
        self.fast = {}
        self.fast_md5 = {}
        self.stages = {}  # (dtype, shape) -> _Stage (torch's kernels only)
        self.staged = 0  # elements of the staging buffers
        # tensors staged instead of reduced alone: those the kernels would group anyway
        self.stage_max = torch_kernels.GROUP_ELEMENTS.get(device.type, torch_kernels.GROUP_ELEMENTS_ELSEWHERE)


class _Stage:
    """A staging buffer: copies of small tensors of one dtype and shape (`key`) as rows, waiting for one
    reduction along them into `slots`; `views`: each row as a tensor of that shape, made once (a copy
    into a row is one op)."""

    __slots__ = ("key", "rows", "views", "used", "slots")

    def __init__(self, device, key, n):
        dtype, shape = key
        count = max(1, min(STAGE_ROWS, STAGE_ELEMENTS // max(1, n)))
        self.key = key
        self.rows = torch.empty((count, n), dtype=dtype, device=device)
        self.views = self.rows.view(count, *shape).unbind(0)
        self.used = 0
        self.slots = []  # the slot of each row used


# staging buffers launched and free, of any session: (device, dtype, shape) -> [_Stage]; a session (a step)
# takes them from here rather than making its own (the views of a buffer's rows take ~200 µs to make).
# Reused in stream order, as the kernels' scratch memory is; at most STAGE_TOTAL elements kept.
_free_stages = {}
_free_elements = [0]


def _take_stage(device, key, n):
    free = _free_stages.get((device, *key))
    if free:
        try:
            stage = free.pop()
        except IndexError:  # taken meanwhile by another thread's session
            return _Stage(device, key, n)
        _free_elements[0] -= stage.rows.numel()
        return stage
    return _Stage(device, key, n)


def drop_free_stages():
    """Let every free staging buffer go (a debugger closed: its device memory is the user's again)."""
    _free_stages.clear()
    _free_elements[0] = 0


def _give_back(stage):
    stage.used = 0
    stage.slots = []
    size = stage.rows.numel()
    if _free_elements[0] + size > STAGE_TOTAL:
        return  # let it go
    _free_elements[0] += size
    _free_stages.setdefault((stage.rows.device, *stage.key), []).append(stage)


def _launched_first(waiting, touching):
    """(the waiting items an in-place change of `touching` may reach, the others): sorted while few wait,
    above SHARE_CHECK_MAX all go (the batch is large enough)."""
    if len(waiting) > SHARE_CHECK_MAX:
        return waiting, []
    return _split_by_memory(waiting, touching)


def _gone(x, storage):
    """Whether `x` no longer holds the memory it was queued with (`storage`: the address of its storage then):
    that storage freed (FSDP resizes a gathered parameter's to nothing: its address reads 0) or replaced
    (`x.data = ...`, as Megatron frees a pipeline stage's output once sent). Reading `x` then reads memory
    that is not what was recorded."""
    try:
        return x.untyped_storage().data_ptr() != storage
    except (RuntimeError, NotImplementedError, TypeError):
        return True


def _storage(x):
    """The address of `x`'s storage (None: it has none), read once when it starts waiting: an in-place call
    compares it with its own tensors' (while up to SHARE_CHECK_MAX wait, an item meets many such calls)."""
    try:
        return x.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _split_by_memory(waiting, tensors):
    """(the waiting items whose tensor shares a storage with one of `tensors`, the others); all of them
    when a tensor has no storage to compare."""
    try:
        changing = {t.untyped_storage().data_ptr() for t in tensors}
    except (RuntimeError, NotImplementedError, TypeError):
        return waiting, []
    go = [w for w in waiting if w[4] in changing or w[4] is None]
    if not go:  # the common case (an optimizer's in-place update of a tensor nothing waits for)
        return go, waiting
    if any(w[4] is None for w in go):  # an item without a storage address cannot be told apart
        return waiting, []
    return go, [w for w in waiting if w[4] not in changing]

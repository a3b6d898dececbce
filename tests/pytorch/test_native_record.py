"""Summarizer.record's C path (msprobe._record, src/msprobe/_native/record.c) against its Python path
(MSPROBE_NATIVE_RECORD=0): the same tensors give equal records and the same cache behaviour, the C path
takes the cases it is for (and hands the rest back untouched), and it leaks nothing."""

import contextlib
import gc
import sys
import tracemalloc
import weakref
import zlib

import numpy as np
import pytest
import torch

from msprobe.pytorch.summary import cache, host, slots
from msprobe.pytorch.summary.cache import CacheEntry, exact_key
from msprobe.pytorch.summary.device import _Stage
from msprobe.pytorch.summary.slots import Buffer
from msprobe.pytorch.summary.summarizer import Summarizer

pytestmark = pytest.mark.usefixtures("host_path")  # (conftest.py)

pytest.importorskip("msprobe._record", reason="msprobe._record not built (no C compiler)")
if host.kernel is None:
    pytest.skip("msprobe._moments not built or MSPROBE_NATIVE_STATS=0", allow_module_level=True)

TASKS = [dict(stats=True, md5=False), dict(stats=True, md5=True), dict(stats=False, md5=True)]


@pytest.fixture(autouse=True)
def keyed_small_tensors(monkeypatch):
    """These tests are of the keyed paths and use small tensors: every tensor is keyed here (the small
    tensors read again without a key have their tests in test_unkeyed_records.py)."""
    monkeypatch.setattr(cache, "UNKEYED_MAX", 0)


def pair(monkeypatch, **task):
    """(C-path summarizer, Python-path summarizer) for the same task."""
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1")
    fast = Summarizer(**task)
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "0")
    slow = Summarizer(**task)
    monkeypatch.delenv("MSPROBE_NATIVE_RECORD")
    assert fast._fast is not None and slow._fast is None
    return fast, slow


def taken(s, t, shared=False):
    """The C path's record of `t`, asserting it took it (None would send `t` to the Python path)."""
    rec = s._fast(s, t, shared)
    assert rec is not None, "the C path handed a tensor of its own cases to Python"
    return rec


def same(fast, slow, t, shared=False):
    """The record and cache entry of `t` by both paths: equal, fields in the same order."""
    a, ea = fast.summarize(t, shared=shared)
    b, eb = slow.summarize(t, shared=shared)
    assert a == b and list(a) == list(b)
    assert (ea is None) == (eb is None)
    if ea is not None:
        assert (ea.version, ea.values, ea.slots) == (eb.version, eb.values, eb.slots)
        assert ea.ref() is eb.ref() is t.untyped_storage()
    return a, ea


def named_dtype(fast, slow, dtype):
    """A tensor of `dtype` recorded by both (the Python path names dtypes; the C path takes known ones)."""
    t = torch.ones(2, dtype=dtype)
    fast.record(t)
    slow.record(t)
    return t


def tables(s):
    """The summarizer's two tables, comparable across summarizers (objects by record and key)."""
    objects = sorted((row[4].version, row[1], tuple(row[2]), tuple(row[3].items())) for row in s._objects.values())
    cache = sorted((k[0], str(k[1]), str(k[2]), k[3], e.version, tuple(e.values.items())) for k, e in s._cache.items())
    return objects, cache


@pytest.mark.parametrize("task", TASKS, ids=["stats", "stats+md5", "md5"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32])
def test_fresh_tensor_record_and_table_entries_match_python(monkeypatch, task, dtype):
    fast, slow = pair(monkeypatch, **task)
    x = (torch.randn(16, 33) * 1000).to(dtype)
    named = named_dtype(fast, slow, dtype)
    want = slow.record(x)
    got = taken(fast, x)
    assert got == want and list(got) == list(want)
    assert list(got) == ["type", "dtype", "shape", *(["Max", "Min", "Mean", "Norm"] if task["stats"] else []),
                         *(["md5"] if task["md5"] else []), "requires_grad"]
    assert tables(fast) == tables(slow)
    (key, entry), = [(k, e) for k, e in fast._cache.items() if k[0] == x.data_ptr()]
    assert key == (x.data_ptr(), dtype, x.device, ((1, x.numel()),))
    assert entry.ref() is x.untyped_storage() and entry.slots == [] and entry.file is None
    row = fast._objects[id(x)]
    assert row[0]() is x and row[4] is entry and fast.entry is entry


def test_object_hit_shares_or_copies_and_checks_requires_grad(monkeypatch):
    fast, slow = pair(monkeypatch)
    x = torch.randn(8, 8)
    first = same(fast, slow, x, shared=True)[0]
    assert taken(fast, x, shared=True) is first  # shared: the one dict of this unchanged tensor
    copy = taken(fast, x)
    assert copy == first and copy is not first
    copy["data_name"] = "x.npy"  # what a caller adds stays in its own record
    assert "data_name" not in taken(fast, x)
    x.requires_grad_()
    flipped = taken(fast, x, shared=True)
    assert flipped["requires_grad"] is True and first["requires_grad"] is False and list(flipped) == list(first)
    same(fast, slow, x)
    same(fast, slow, x, shared=True)
    assert tables(fast) == tables(slow)


@pytest.mark.parametrize("task", TASKS, ids=["stats", "stats+md5", "md5"])
def test_device_path_records_are_taken_with_their_slots_filled_when_resolved(monkeypatch, task):
    """On the device path (MSPROBE_DEVICE_SUMMARY=1) a dense tensor's first record (its summaries into
    slots, through Summarizer._slots_of), the same object seen again and another object over the same
    memory are the C path's: shared, the one dict filled in place; else a dict of its own
    (requires_grad as the tensor's now) that the resolve fills too; all as the Python path's."""
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1")
    fast = Summarizer(device_path=True, **task)
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "0")
    slow = Summarizer(device_path=True, **task)
    monkeypatch.delenv("MSPROBE_NATIVE_RECORD")
    field = "Max" if task["stats"] else "md5"
    named_dtype(fast, slow, torch.float32)
    fast.start_resolve().finish()
    slow.start_resolve().finish()
    z = torch.randn(3, 5)
    first = fast._fast(fast, z, True, True)  # taken: its slots made, its entries as the Python path's
    assert first is not None and fast._objects[id(z)][3] is first and fast.entry.slots and first[field] is None
    x = torch.randn(8, 8)
    got, want = {}, {}
    for s, out in ((fast, got), (slow, want)):
        out["first"] = s.record(x, True, True)
        out["shared"] = s.record(x, True, True)
        out["own"] = s.record(x, True, False)
        x.requires_grad_()
        out["flipped"] = s.record(x, True, True)
        x.requires_grad_(False)
        out["view"] = s.record(x.view(64), True, True)  # the cache entry, its own shape
        out["view_own"] = s.record(x.view(4, 16), False, False)
        assert s.entry is s._objects[id(x)][4] and s.entry.slots
    assert taken(fast, x, shared=True) is got["first"] and got["shared"] is got["first"]
    assert got["own"] is not got["first"] and got["flipped"]["requires_grad"] is True
    assert got["first"][field] is None and got["view"]["shape"] == [64]  # still in the slots
    for s in (fast, slow):
        s.start_resolve().finish()
    assert got == want and [list(r) for r in got.values()] == [list(r) for r in want.values()]
    assert got["own"][field] == got["view_own"][field] == got["first"][field] is not None
    assert first[field] is not None
    after = taken(fast, x)  # resolved since: a copy with the values
    assert after == got["first"] and after is not got["first"]


def test_memory_hit_after_a_view_and_recompute_after_an_in_place_op(monkeypatch):
    fast, slow = pair(monkeypatch)
    x = torch.randn(6, 40)
    _, entry = same(fast, slow, x)
    flat = x.view(-1)
    got = taken(fast, flat)  # another object over the same memory: the cache entry, its own shape
    assert got["shape"] == [240] and fast.entry is entry
    same(fast, slow, x.view(240))
    x.mul_(3)  # version bump: read again, by both paths
    rec, again = same(fast, slow, x)
    assert again is not entry and rec["Max"] == pytest.approx(3 * entry.values["Max"], rel=1e-6)
    assert taken(fast, x) == rec
    same(fast, slow, flat)  # the view sees the bump too (one version counter)
    assert tables(fast) == tables(slow)


def test_freed_and_reused_memory_is_read_again(monkeypatch):
    """Another storage over the same address at the same version (memory freed and reused): the cache's
    weak reference to the old storage is dead, so both paths read the new values."""
    fast, slow = pair(monkeypatch)
    buf = np.arange(64, dtype=np.float32)
    a = torch.from_numpy(buf)
    ra, _ = same(fast, slow, a)
    ptr = a.data_ptr()
    del a
    buf *= -1
    b = torch.from_numpy(buf)
    assert b.data_ptr() == ptr and b._version == 0
    rb, _ = same(fast, slow, b)
    assert rb["Max"] == -ra["Min"] and rb["Min"] == -ra["Max"]
    assert taken(fast, b) == rb


@pytest.mark.parametrize("make", [
    lambda: torch.randn(6, 5).t(),  # not contiguous
    lambda: torch.arange(12, dtype=torch.int16),  # a dtype the kernel does not read
    lambda: torch.randn(7).half(),
    lambda: torch.tensor([2.5]),  # one element: keyed by its layout
    lambda: torch.empty(0),
    lambda: torch.tensor([1.0, float("nan"), 3.0]),  # torch's reductions say how a NaN shows
    lambda: torch.randn(3, 4).as_subclass(type("Sub", (torch.Tensor,), {})),
], ids=["transposed", "int16", "float16", "one", "empty", "nan", "subclass"])
def test_other_tensors_go_to_python_untouched_and_match(monkeypatch, make):
    fast, slow = pair(monkeypatch, stats=True, md5=True)
    t = make()
    named = named_dtype(fast, slow, t.dtype)
    before = tables(fast)
    assert fast._fast(fast, t, False) is None
    assert tables(fast) == before  # nothing changed: the Python path starts from scratch
    same(fast, slow, t)
    assert tables(fast) == tables(slow)



def _views():
    """Views whose elements are not in index order, as attention makes them: (name, tensor, whether the
    host kernel reads it: one dense run or rows that do not overlap)."""
    qkv = torch.randn(2, 16, 3 * 24)
    q, k, _ = qkv.chunk(3, dim=-1)  # rows of a wider tensor
    heads = q.view(2, 16, 4, 6)
    wide = torch.randn(2, 16, 3 * 64).chunk(3, dim=-1)[1]
    return [
        ("transposed", torch.randn(6, 5).t(), True),
        ("chunk", q, True),
        ("chunk_heads", heads, True),
        ("chunk_heads_transposed", heads.transpose(1, 2), True),
        ("key_permuted", k.view(2, 16, 4, 6).permute(0, 2, 3, 1), True),
        ("dense_permuted", torch.randn(2, 3, 4, 5).permute(2, 0, 3, 1), True),
        ("size_one_dims", torch.randn(1, 6, 1, 8).transpose(1, 3), True),
        ("float64_transposed", torch.randn(6, 8, dtype=torch.float64).t(), True),
        ("bfloat16_transposed", torch.randn(6, 8).to(torch.bfloat16).t(), True),
        ("every_other_row", torch.randn(8, 9, 10)[:, ::2], False),  # three levels: torch's reductions
        ("expanded", torch.randn(3, 1).expand(3, 5), False),  # stride 0
        ("overlapping_rows", torch.randn(20).as_strided((3, 5), (2, 1)), False),
        # runs of 64 bytes and more: with md5 too, checksummed in place run after run
        ("wide_chunk", wide, True),
        ("wide_heads_transposed", wide.view(2, 16, 4, 16).transpose(1, 2), True),
    ]


@pytest.mark.parametrize("make_index", range(len(_views())), ids=[v[0] for v in _views()])
def test_views_out_of_index_order_are_taken_keyed_by_their_elements(monkeypatch, make_index):
    """A transpose or a chunk of a wider tensor (q, k and v of a fused projection, their heads) is the C
    path's when the host kernel reads it: the record and both tables as the Python path's, the same entry
    for every view of the same elements; other layouts go to Python untouched. With md5 (the checksum
    reads elements in index order) a view is keyed by its layout, and the C path's when msprobe._crc reads
    it in place (dense runs of 64 bytes or more)."""
    fast, slow = pair(monkeypatch, stats=True, md5=False)
    _, t, read = _views()[make_index]
    named_dtype(fast, slow, t.dtype)
    if read:
        want = slow.record(t)
        assert taken(fast, t) == want and list(fast.record(t)) == list(want)
        assert tables(fast) == tables(slow)
        again = t.contiguous()  # other memory, read again in index order (sums may differ in the last bits)
        got = taken(fast, again)
        assert got == slow.record(again) and (got["Max"], got["Min"]) == (want["Max"], want["Min"])
        assert got["Mean"] == pytest.approx(want["Mean"], rel=1e-5, abs=1e-7)
        if t.dim() > 1:  # another view of the same elements: the same cache entry, its own shape
            other = t.transpose(0, -1)
            entry = fast._objects[id(t)][4]
            got = taken(fast, other)
            assert fast.entry is entry and got["shape"] == list(other.shape) and got == slow.record(other)
    else:
        before = tables(fast)
        assert fast._fast(fast, t, False) is None
        assert tables(fast) == before
        same(fast, slow, t)
    assert tables(fast) == tables(slow)
    md5_fast, md5_slow = pair(monkeypatch, stats=True, md5=True)
    named_dtype(md5_fast, md5_slow, t.dtype)
    if read and _dense_run_bytes(t) >= 64:  # msprobe._crc reads it in place: keyed by its layout
        want = md5_slow.record(t)
        assert taken(md5_fast, t) == want and want["md5"] == f"{zlib.crc32(t.contiguous().numpy().tobytes()):08x}"
        assert tables(md5_fast) == tables(md5_slow)
        assert [k for k in md5_fast._cache if k[0] == t.data_ptr()] == [exact_key(t)]
    else:
        assert md5_fast._fast(md5_fast, t, False) is None  # short runs: the Python path copies it
        same(md5_fast, md5_slow, t)


def _dense_run_bytes(t):
    """Bytes of the dense runs `t`'s index order is made of (its innermost dimensions that step densely)."""
    run = t.element_size()
    for size, stride in reversed(list(zip(t.shape, t.stride()))):
        if size != 1 and stride * t.element_size() != run:
            break
        run *= size
    return run


def test_device_path_takes_views_in_any_layout(monkeypatch):
    """On the device path the C path takes every view (its slots through Summarizer._slots_of, with the
    span the Python path computes), statistics only; the resolved records equal the Python path's."""
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1")
    fast = Summarizer(device_path=True)
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "0")
    slow = Summarizer(device_path=True)
    monkeypatch.delenv("MSPROBE_NATIVE_RECORD")
    views = [t for _, t, _ in _views()]
    for t in views:
        named_dtype(fast, slow, t.dtype)
    got, want = [], []
    for t in views:
        got.append(taken(fast, t, shared=True))
        want.append(slow.record(t, False, True))
    assert tables(fast)[1] == tables(slow)[1]
    for s in (fast, slow):
        s.start_resolve().finish()
    assert got == want and all(r["Max"] is not None for r in got)
    for t, rec in zip(views, got):
        x = t.double()
        assert rec["Max"] == pytest.approx(x.max().item()) and rec["Mean"] == pytest.approx(x.mean().item(), abs=1e-6)


def device_pair(monkeypatch, **task):
    """(C-path, Python-path) device-path summarizers for `task`, and the list of tensors that then reach
    Summarizer._slots_of (the Python path's slots), in order."""
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1")
    fast = Summarizer(device_path=True, **task)
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "0")
    slow = Summarizer(device_path=True, **task)
    monkeypatch.delenv("MSPROBE_NATIVE_RECORD")
    asked = []
    python_slots = Summarizer._slots_of
    monkeypatch.setattr(Summarizer, "_slots_of", lambda self, t, *a: asked.append(t) or python_slots(self, t, *a))
    return fast, slow, asked


def _plain(v):
    """`v` (a queued item, or part of one) with tensors as "tensor", slots as ("slot", kind, row) and staging
    buffers by their key and rows used."""
    if isinstance(v, torch.Tensor):
        return "tensor"
    if isinstance(v, _Stage):  # a staging buffer waiting as one item
        return ("stage", v.key, v.used)
    if isinstance(v, tuple):
        if len(v) == 2 and isinstance(v[0], Buffer):
            return ("slot", v[0].kind, v[1])
        return tuple(_plain(e) for e in v)
    return v


def _queued(s):
    """What a device-path summarizer has queued, comparable across summarizers: per waiting item its group,
    its item with slots as (kind, row), its version and memory and bytes; the bytes held; the buffers' rows
    (element counts, dtypes, bytes, fields dicts, records waiting); pending and the memory set."""
    d = s.slots
    items = [(_plain(group), _plain(item), version, address, nbytes)
             for (group, item, x, version, address), nbytes in d._waiting.queue]
    bufs = [(b.kind, b.used, b.ns, b.dtypes, b.nbytes, len(b.fields), len(b.fills)) for b in d._buffers]
    return items, d._waiting.held, bufs, d.pending, d._memory


def test_device_path_queues_a_dense_tensors_statistics_in_c(monkeypatch):
    """On the device path the C path queues a contiguous tensor's deferred statistics itself, once the Python
    path has deferred one of its dtype on that lane (`_Lane.fast`): no Summarizer._slots_of, and the same
    slots, queue, bounds and records as the Python path makes. A gradient-free tensor waits detached (its
    own memory, not the object), one in autograd as it is. The rest still goes through _slots_of:
    not deferred, a dtype the lane has not deferred, a view, a full buffer. A batch the queue fills is
    launched there and then."""
    from msprobe.pytorch.summary import device
    monkeypatch.setattr(device, "DEFER_TENSORS", 6)  # (read once, as the summarizers are made)
    fast, slow, asked = device_pair(monkeypatch)
    first = torch.randn(4, 4)
    for s in (fast, slow):
        s.record(first, True, True)  # the Python path defers a float32 tensor: the lane says C may
    assert [id(t) for t in asked] == [id(first)] * 2 and torch.float32 in fast.slots._lanes[first.device].fast
    asked.clear()
    tensors = [torch.randn(3, 5), torch.randn(7, requires_grad=True), torch.arange(6.0).view(2, 3)]
    got = [fast.record(t, True, True) for t in tensors]
    assert not asked  # all queued in C
    want = [slow.record(t, True, True) for t in tensors]
    assert _queued(fast) == _queued(slow) and len(fast.slots._waiting.queue) == 4
    held = [x for (_, _, x, _, _), _ in fast.slots._waiting.queue]
    assert held[1] is not tensors[0] and held[1].data_ptr() == tensors[0].data_ptr()  # detached
    assert held[2] is tensors[1]  # in autograd: as it is
    assert tables(fast) == tables(slow)
    # what still goes through _slots_of
    others = [torch.randn(5, dtype=torch.float64),  # a dtype the lane has not deferred yet
              torch.randn(4, 6).t()]  # a view
    for t in others:
        asked.clear()
        assert fast.record(t, True, True) is not None and len(asked) == 1 and asked[0] is t
        slow.record(t, True, True)
    asked.clear()
    not_deferred = torch.randn(9)
    fast.record(not_deferred, False, True)
    assert len(asked) == 1 and asked[0] is not_deferred
    slow.record(not_deferred, False, True)
    # a full open buffer: Python opens the next one
    full = fast.slots._lanes[first.device].open[slots.STATS]
    used, full.used = full.used, slots.SLOTS_PER_BUFFER
    asked.clear()
    fast.record(torch.randn(3), True, True)
    assert len(asked) == 1 and fast.slots._lanes[first.device].open[slots.STATS] is not full
    full.used = used
    # the batch is full at DEFER_TENSORS items: launched by the C path as by Deferral.add
    for s in (fast, slow):
        s.start_resolve().finish()
    asked.clear()
    batch = [torch.randn(2, 2) for _ in range(6)]
    for s in (fast, slow):
        for t in batch:
            s.record(t, True, True)
        assert not s.slots._waiting.queue and s.slots._waiting.held == 0
    # the Python summarizer's six, and the C one's first: a resolve closes the open buffers (Python opens one)
    assert len(asked) == 7 and asked[0] is batch[0] and asked[1] is batch[0]
    for s in (fast, slow):
        s.start_resolve().finish()
    assert got == want and all(r["Max"] is not None for r in got)
    assert got[2]["Max"] == 5.0 and got[2]["Mean"] == pytest.approx(2.5)


def test_device_path_queues_statistics_and_checksum_as_one_item_in_c(monkeypatch):
    """With md5 the C path queues a contiguous tensor's statistics and checksum as the one item
    DeviceSummaries.stats_checksum makes, in both open buffers, once the Python path has deferred one of
    its dtype on that lane (`_Lane.fast_md5`); the records, checksums included, are the Python path's."""
    fast, slow, asked = device_pair(monkeypatch, md5=True)
    first = torch.randn(4, 4)
    for s in (fast, slow):
        s.record(first, True, True)
    lane = fast.slots._lanes[first.device]
    assert len(asked) == 2 and torch.float32 in lane.fast_md5 and torch.float32 not in lane.fast
    asked.clear()
    tensors = [torch.randn(3, 5), torch.randn(6, requires_grad=True), torch.arange(12.0)]
    got = [fast.record(t, True, True) for t in tensors]
    assert not asked
    want = [slow.record(t, True, True) for t in tensors]
    assert _queued(fast) == _queued(slow)
    assert [len(b.fields) for b in fast.slots._buffers] == [4, 4]  # a statistics row and a checksum row each
    assert tables(fast) == tables(slow)
    for s in (fast, slow):
        s.start_resolve().finish()
    assert got == want and all(r["Max"] is not None and len(r["md5"]) == 8 for r in got)
    assert got[2]["md5"] == f"{zlib.crc32(tensors[2].numpy().tobytes()):08x}"


def test_device_path_stages_a_dense_tensor_taken_now_in_c(monkeypatch):
    """On torch's kernels a tensor whose statistics are taken now (L0's module outputs) is copied into the next
    row of its staging buffer (device.py's _Stage); the C path does it once the Python path has made that
    stage (its first row) and while a row is left after it (the last launches: Python's). The stages,
    slots and records are the Python path's; a tensor in autograd is copied detached."""
    from msprobe.pytorch.summary import device
    monkeypatch.setattr(device, "STAGE_ROWS", 5)
    fast, slow, asked = device_pair(monkeypatch)
    tensors = [torch.randn(3, 4) for _ in range(7)]
    tensors[2].requires_grad_()
    got, want = [], []
    for s, out in ((fast, got), (slow, want)):
        stages = []
        for t in tensors:
            out.append(s.record(t, False, True))
            lane = s.slots._lanes[t.device]
            stages.append([(k, st.used, st.rows.clone(), [r for _, r in st.slots]) for k, st in lane.stages.items()])
        out.append(stages)
    # Python: the stage's first row (made, queued), its last (launched), the next stage's first; C: rows 2-4
    assert [id(t) for t in asked[:3]] == [id(tensors[0]), id(tensors[4]), id(tensors[5])]
    assert len(asked) == 3 + 7
    for a, b in zip(got[-1], want[-1]):
        assert [(k, used, slots) for k, used, _, slots in a] == [(k, used, slots) for k, used, _, slots in b]
        assert all(torch.equal(x[:used], y[:used]) for (_, used, x, _), (_, _, y, _) in zip(a, b))  # rows in use
    stage = fast.slots._lanes[tensors[0].device].stages[(torch.float32, torch.Size([3, 4]))]
    assert not stage.rows.requires_grad and stage.rows.grad_fn is None  # the copy of tensors[2]: detached
    assert _queued(fast) == _queued(slow)
    for s in (fast, slow):
        s.start_resolve().finish()
    assert got[:-1] == want[:-1]
    for t, rec in zip(tensors, got):
        assert rec["Max"] == pytest.approx(t.max().item()) and rec["Norm"] == pytest.approx(t.norm().item())


@pytest.mark.parametrize("task", TASKS, ids=["stats", "stats+md5", "md5"])
def test_large_tensor_is_read_on_torchs_threads_as_the_python_path_reads_it(monkeypatch, task):
    """From host.PARALLEL_MIN elements the C path reads (statistics and CRC) on as many threads as torch
    has now (the Recorder asks torch.get_num_threads for every such read), below on one; both records
    equal the Python path's."""
    from msprobe.pytorch.summary import summarizer
    asked = []

    def counting():
        asked.append(True)
        return torch.get_num_threads()

    monkeypatch.setattr(summarizer.torch, "get_num_threads", counting)
    fast, slow = pair(monkeypatch, **task)
    monkeypatch.undo()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for n in (host.PARALLEL_MIN - 1, host.PARALLEL_MIN, 3 * host.PARALLEL_MIN + 5):
            asked.clear()
            x = torch.randn(n)
            want = slow.record(x)
            assert taken(fast, x) == want
            assert len(asked) == (1 if n >= host.PARALLEL_MIN else 0)  # one ask, for the kernel and the CRC
        assert tables(fast) == tables(slow)
    finally:
        torch.set_num_threads(before)

def test_inference_tensors_go_to_python(monkeypatch):
    fast, slow = pair(monkeypatch)
    with torch.inference_mode():
        t = torch.randn(4, 4)
    named = named_dtype(fast, slow, t.dtype)
    before = tables(fast)
    assert fast._fast(fast, t, False) is None and tables(fast) == before
    outcomes = []
    for s in (fast, slow):  # whatever the Python path does with it, it does for both
        try:
            outcomes.append(s.record(t))
        except RuntimeError as e:
            outcomes.append(str(e))
    assert outcomes[0] == outcomes[1] and tables(fast) == tables(slow)


def test_parameters_match(monkeypatch):
    fast, slow = pair(monkeypatch)
    p = torch.nn.Parameter(torch.randn(5, 5))
    named = named_dtype(fast, slow, p.dtype)
    assert taken(fast, p) == slow.record(p)
    assert tables(fast) == tables(slow) and named.dtype is p.dtype


@contextlib.contextmanager
def collector_off():
    """The cyclic collector off inside (after one collection), as before after."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _traced_growth(s, burst, n):
    """Bytes still traced after `burst(s, n)` and clearing the summarizer's tables."""
    def run(k):
        burst(s, k)
        s.clear()
        s.entry = None
    run(2000)
    tracemalloc.start()
    try:
        run(1000)
        start = tracemalloc.get_traced_memory()[0]
        run(n)
        return tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()


def _warmed_growth(s, burst, warm, n, counts):
    """(bytes `_traced_growth` finds after `burst(s, n)`, whether `counts()` is as before it): after `warm`
    records first (the first records take references torch keeps, on either path) and the tables cleared."""
    burst(s, warm)
    s.clear()
    s.entry = None
    before = counts()
    grown = _traced_growth(s, burst, n)
    return grown, counts() == before


def test_no_leaks_and_no_cycles_over_1e5_records(monkeypatch):
    """1e5 records, hits and fresh ones: no memory kept beyond the tables' own bounds, every reference
    taken given back, and the summarizer and tensors freed by reference counting alone (no cycles)."""
    # reference counts of shared objects (dtypes, CacheEntry) move only by what runs inside
    with collector_off():
        pool = [torch.randn(32, 32) for _ in range(50)]
        probe = pool[0]
        raw = bytearray(256)

        def burst(s, n):
            for i in range(n):
                t = pool[i % len(pool)]
                s.record(t, shared=bool(i & 1))
                if i % 3 == 0:
                    t.add_(0.0)  # a version bump: a fresh read next time

        def reused(s, n):  # a new storage over memory read before, each time (freed and reused)
            for i in range(n):
                s.record(pool[i % len(pool)])
                s.record(torch.frombuffer(raw, dtype=torch.float32))

        def viewed(s, n):  # statistics only: views are the C path's (keyed by their element spans)
            for i in range(n):
                t = views[i % len(views)]
                s.record(t, shared=bool(i & 1))
                if i % 3 == 0:
                    t.add_(0.0)

        counts = lambda: [sys.getrefcount(o) for o in (probe, torch.float32, torch.strided, CacheEntry)]
        monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1")
        s = Summarizer(md5=True)
        for warm in (burst, reused):  # torch keeps a few references the first time (either path): not counted
            warm(s, 100)
        s.clear()
        s.entry = None
        before = counts()
        grown = _traced_growth(s, burst, 100_000)
        assert grown < 64 * 1024, f"{grown} bytes kept after 1e5 records"
        # torch itself keeps a little per tensor made over reused memory: the C path no more than Python
        c_kept = _traced_growth(s, reused, 10_000)
        assert counts() == before
        # the kernel's two view layouts, of tensors the checks below do not free (a view keeps its base alive)
        views = [t.t() for t in pool[20:30]] + [t[:, :16] for t in pool[30:40]]
        stats_only = Summarizer()
        grown, same_counts = _warmed_growth(stats_only, viewed, 100, 50_000, counts)
        assert grown < 64 * 1024, f"{grown} bytes kept after 5e4 records of views"
        assert same_counts
        del stats_only
        monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "0")
        py_kept = _traced_growth(Summarizer(md5=True), reused, 10_000)
        assert c_kept <= py_kept + 32 * 1024, (c_kept, py_kept)
        s.record(probe)
        gone = weakref.ref(s)
        del s
        assert gone() is None, "the summarizer is held by a reference cycle"
        held = weakref.ref(pool[1])
        fresh = Summarizer()
        fresh.record(pool[1])
        del pool[1]
        assert held() is None, "a recorded tensor is kept alive"


@pytest.mark.parametrize("md5", [False, True], ids=["stats", "stats+md5"])
def test_device_path_leaks_nothing_and_makes_no_cycles(monkeypatch, md5):
    """The device path's C queueing and staging over 2e4 records (deferred and taken now, shared and not,
    resolved every 500): no memory kept once resolved and cleared, every reference given back, and the
    summarizer freed by reference counting alone."""
    with collector_off():
        pool = [torch.randn(16, 16) for _ in range(40)]
        probe = pool[0]

        def burst(s, n):
            for i in range(n):
                t = pool[i % len(pool)]
                s.record(t, bool(i & 2), bool(i & 1))  # deferred (queued) or taken now (staged)
                if i % 3 == 0:
                    t.add_(0.0)  # a fresh summary next time
                if i % 500 == 499:
                    s.start_resolve().finish()
            s.start_resolve().finish()

        counts = lambda: [sys.getrefcount(o) for o in (probe, torch.float32, CacheEntry, Buffer)]
        monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1")
        s = Summarizer(device_path=True, md5=md5)
        grown, same_counts = _warmed_growth(s, burst, 1000, 20_000, counts)  # (warm: lanes and stages too)
        assert grown < 64 * 1024, f"{grown} bytes kept after 2e4 device-path records"
        assert same_counts
        gone = weakref.ref(s)
        del s
        assert gone() is None, "the summarizer is held by a reference cycle"


def test_the_extension_imports_first_in_a_fresh_interpreter():
    """`import msprobe._record` before anything imported msprobe._moments: its capsule's module is imported
    by the extension itself (it was an AttributeError, which no ImportError fallback catches)."""
    import subprocess
    done = subprocess.run([sys.executable, "-c", "import msprobe._record as r; print(r.Recorder.__name__)"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "Recorder", done.stderr


def test_checksum_is_zlibs_crc32_of_the_values(monkeypatch):
    """The C path's md5 field is zlib's CRC-32 of the tensor's bytes as 8 hex digits (msProbe's); a
    negative view (its memory holds the negated values) goes to the Python path, which reads the values."""
    fast, slow = pair(monkeypatch, stats=True, md5=True)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        named_dtype(fast, slow, dtype)
        for n in (2, 3, 1000, 4097):
            x = torch.randn(n).to(dtype)
            want = f"{zlib.crc32(x.view(torch.uint8).numpy().tobytes()):08x}"
            assert taken(fast, x)["md5"] == want
    neg = torch._neg_view(torch.randn(64))
    assert fast._fast(fast, neg, False, False) is None
    assert fast.record(neg)["md5"] == f"{zlib.crc32(neg.resolve_neg().numpy().tobytes()):08x}"


@pytest.mark.parametrize("device_path", [False, True], ids=["host", "device_path"])
def test_random_layouts_match_the_python_path(monkeypatch, device_path):
    """Random strided views (permuted, gapped, expanded, offset; three dtypes) recorded by both paths give
    the same records, once resolved, and the same cache keys: whatever the C path takes it keys and reads
    as the Python path does, and what it hands back changes nothing."""
    import random

    rng = random.Random(7)
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1")
    fast = Summarizer(device_path=device_path)
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "0")
    slow = Summarizer(device_path=device_path)
    monkeypatch.delenv("MSPROBE_NATIVE_RECORD")
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        named_dtype(fast, slow, dtype)
    made, pending = 0, []
    while made < 400:
        nd = rng.randint(1, 5)
        shape = [rng.randint(1, 5) for _ in range(nd)]
        order = list(range(nd))
        rng.shuffle(order)
        strides, step = [0] * nd, 1
        for d in reversed(order):  # a permutation of a dense layout, some dimensions stepping over gaps
            strides[d] = step * rng.choice((1, 1, 1, 2))
            step = strides[d] * shape[d]
        if rng.random() < 0.1:
            strides[rng.randrange(nd)] = 0  # expanded
        span = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
        if span > 400:
            continue
        base = torch.randn(400, dtype=rng.choice((torch.float32, torch.float64, torch.bfloat16)))
        t = base.as_strided(shape, strides, rng.randint(0, 400 - span))
        pending.append((fast.record(t, False, False), slow.record(t, False, False), t))
        made += 1
        if made % 50 == 0:
            assert sorted(map(str, fast._cache)) == sorted(map(str, slow._cache))
            for s in (fast, slow):
                s.start_resolve().finish()
                s.clear()
            for a, b, t in pending:
                assert a == b and list(a) == list(b), (t.shape, t.stride())
                assert a["Max"] is not None
            pending = []

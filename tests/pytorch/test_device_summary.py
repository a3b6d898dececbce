"""The accelerator path of the PyTorch dump, proved on a CPU: summaries in device slots, read back in
batches — the same records as the host path, and no device->host read per API call.

`MSPROBE_DEVICE_SUMMARY=1` makes CPU tensors take the path CUDA tensors take (torch's reductions into
slots; the Triton kernels CUDA uses are checked here in Triton's interpreter when Triton is installed,
and on a GPU by tests/gpu).
"""

import collections
import math
import os
import subprocess
import sys
import textwrap
import zlib

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from msprobe.core import checksum
from msprobe.core.dump import capture as dump_capture
from msprobe.core.dump.reader import DumpReader, find_rank_dirs
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.summary import torch_kernels
from msprobe.pytorch.summary.summarizer import Summarizer
import msprobe_test_models as models  # loaded by conftest.py

TASKS = [("statistics", "statistics"), ("statistics", "md5"), ("tensor", "statistics"), ("overflow_check", None)]


def _dump(tmp, monkeypatch, device_path, level, task, summary, name="transformer", opt="sgd"):
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1" if device_path else "0")
    block = {"summary_mode": summary} if summary else {}
    dbg, dump_path = models.make_debugger(tmp, level, task, **block) if block else \
        models.make_debugger(tmp, level, task)
    model = models.build(name)
    if task == "overflow_check":
        with torch.no_grad():
            model.head.weight[0, 0] = float("inf")  # an overflow from the first step on
    try:
        models.train(model, models.batches(name, 2), dbg, opt=opt)
    finally:
        dbg.close()
    return {r.step: DumpReader(r.path) for r in find_rank_dirs(dump_path)}


def _same(a, b, path):
    if isinstance(a, dict):
        assert list(a) == list(b), (path, list(a), list(b))
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=2e-6, abs_tol=1e-6), (path, a, b)
    else:
        assert a == b, (path, a, b)


def _assert_same_dumps(host, device):
    assert sorted(host) == sorted(device) and host
    for step in host:
        # every deferred summary was launched before anything changed its tensor
        assert not os.path.exists(os.path.join(device[step].rank_dir, "dump_error_info.log"))
        assert list(host[step].keys()) == list(device[step].keys())
        for key in host[step].keys():
            _same(host[step][key], device[step][key], key)


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("task,summary", TASKS)
def test_device_path_writes_the_records_of_the_host_path(tmp_path, monkeypatch, level, task, summary):
    host = _dump(tmp_path / "host", monkeypatch, False, level, task, summary)
    device = _dump(tmp_path / "device", monkeypatch, True, level, task, summary)
    _assert_same_dumps(host, device)
    assert all(len(dump.keys()) > (0 if task == "overflow_check" else 5) for dump in host.values())


@pytest.mark.parametrize("name", sorted(set(models.ZOO) - {"transformer"}))
def test_device_path_writes_the_records_of_the_host_path_on_every_model(tmp_path, monkeypatch, name):
    """The zoo's other models (a CNN with batch norm, an RNN, in-place calls, dropout, a dict output),
    trained with Adam, at mix (the module and API records both)."""
    host = _dump(tmp_path / "host", monkeypatch, False, "mix", "statistics", "statistics", name, "adam")
    device = _dump(tmp_path / "device", monkeypatch, True, "mix", "statistics", "statistics", name, "adam")
    _assert_same_dumps(host, device)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("level,autocast", [("L0", False), ("mix", False), ("mix", True)])
def test_device_path_writes_the_records_of_the_host_path_on_hugging_face_models(tmp_path, monkeypatch, arch,
                                                                                level, autocast):
    """Models the device path was not tuned on: tiny Llama and GPT-2 from transformers, two micro-batches
    a step (gradient accumulation), also under bf16 autocast; the losses are those of the host path's run."""
    hf = pytest.importorskip("hf_models")
    runs = {}
    for device_path in (False, True):
        monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1" if device_path else "0")
        dump_path = tmp_path / ("device" if device_path else "host")
        rank_dir, losses = hf.dump_step(getattr(hf, arch)(), dump_path, level=level, micro_batches=2,
                                        autocast=autocast)
        runs[device_path] = ({0: DumpReader(str(rank_dir))}, losses)
    assert runs[False][1] == runs[True][1]
    _assert_same_dumps(runs[False][0], runs[True][0])


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_the_records_are_on_disk_as_the_backward_pass_ends(tmp_path, monkeypatch, level):
    """The flusher never reads a device, so the records waiting for device summaries are read back and
    written as the backward pass ends: a process that dies or hangs after it keeps the step (tests/core/
    dump/test_signals.py kills one). Before stop(), dump.json already holds every record of the step
    but the backward ones only the step's end completes (a call whose input got no gradient)."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    dbg, dump_path = models.make_debugger(tmp_path, level, "statistics")
    model = models.build("transformer")
    (x, y), = models.batches("transformer", 1)
    dbg.start(model)
    type(model).loss_of(model(x), y).backward()
    (rank_dir,) = [r.path for r in find_rank_dirs(dump_path)]
    written = list(models.read_raw(os.path.join(rank_dir, "dump.json"))["data"])
    stuck = {t.key for t in dbg._session.trackers}
    dbg.stop()
    dbg.step()
    dbg.close()
    final = DumpReader(rank_dir)
    assert written and written == [k for k in final.keys() if k not in stuck]
    assert any(k.endswith(".backward") or ".backward." in k for k in written)


class _ReadCounter:
    """Counts the device->host reads msprobe's own code makes: Tensor.item/tolist/cpu/numpy, truth and
    number conversions, `.to("cpu")` and non-blocking copies (what a read back to pinned memory is)."""

    READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")

    def __init__(self, monkeypatch):
        self.count = 0
        self.where = []
        for name in self.READS:
            self._wrap(monkeypatch, name, lambda *a, **k: True)
        self._wrap(monkeypatch, "to", lambda *a, **k: "cpu" in [str(x) for x in a[1:]] + [str(k.get("device"))])
        self._wrap(monkeypatch, "copy_", lambda *a, **k: bool(k.get("non_blocking")))

    def _wrap(self, monkeypatch, name, is_read):
        orig = getattr(torch.Tensor, name)

        def wrapper(*args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if os.sep + "msprobe" + os.sep in caller and is_read(*args, **kwargs):
                self.count += 1
                self.where.append(f"{name} from {os.path.basename(caller)}:{sys._getframe(1).f_lineno}")
            return orig(*args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, wrapper)


DIM = models.TransformerBlock.DIM


class Deep(nn.Module):
    """`blocks` residual attention + MLP blocks."""

    def __init__(self, blocks):
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(DIM) for _ in range(blocks))
        self.attns = nn.ModuleList(models.Attention(DIM, 2) for _ in range(blocks))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
                                  for _ in range(blocks))

    def forward(self, x):
        for norm, attn, mlp in zip(self.norms, self.attns, self.mlps):
            x = x + attn(norm(x))
            x = x + mlp(x)
        return x


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("summary", ["statistics", "md5"])
def test_no_read_back_per_api_call(tmp_path, monkeypatch, level, summary):
    """A model three times as deep makes three times the records and exactly as many reads: at most a
    fixed handful per step (the batch's copy at stop() and at step()), none per call."""
    def settings():
        monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
        # no flush by the clock: on a loaded machine a step may outlast it and add a read
        monkeypatch.setattr(dump_capture, "FLUSH_SECONDS", 3600.0)
    settings()
    x = torch.randn(2, 6, DIM)
    reads, records = {}, {}
    for blocks in (1, 3):
        torch.manual_seed(0)
        model = Deep(blocks)
        dbg, dump_path = models.make_debugger(tmp_path / str(blocks), level, "md5" if summary == "md5"
                                              else "statistics")
        counter = _ReadCounter(monkeypatch)
        for _ in range(2):
            dbg.start(model)
            model(x).square().mean().backward()
            dbg.stop()
            dbg.step()
        reads[blocks] = counter.count
        # the counter sees a read when there is one: the host path reads an int16 tensor's values (torch's
        # reductions: a dtype the C kernel does not read)
        Summarizer(device_path=False).summarize(torch.arange(5, dtype=torch.int16))
        assert counter.count > reads[blocks]
        monkeypatch.undo()
        settings()
        dbg.close()
        records[blocks] = sum(len(DumpReader(r.path).keys()) for r in find_rank_dirs(dump_path))
    assert records[3] > 2 * records[1] > 0
    assert reads[1] == reads[3] <= 4, (reads, counter.where)


def _zlib_hex(t):
    """msProbe's value: zlib's CRC-32 of the tensor's bytes in index order."""
    return f"{zlib.crc32(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()):08x}"


def test_parallel_crc_in_torch_ops_equals_zlib():
    gen = torch.Generator().manual_seed(0)
    # sizes around a row and a pass (CRC_ROWS rows), several passes with a head
    row, pass_bytes = torch_kernels.ROW, torch_kernels.CRC_ROWS * torch_kernels.ROW
    for nbytes in (1, 3, 4, 7, row - 1, row, row + 1, 4099, pass_bytes, pass_bytes + 1, 2 * pass_bytes + row + 5):
        raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
        got = checksum.finish_raw(int(torch_kernels.crc_raw(raw)), nbytes)
        assert got == f"{zlib.crc32(raw.numpy().tobytes()):08x}", nbytes
    # a raw CRC carried over zeros, and two CRCs combined, as zlib's crc32_combine does
    a, b = bytes(range(100)), bytes(range(7, 250))
    assert checksum.combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    assert checksum.finish_raw(0, 0) == "00000000"


def test_checksum_is_the_same_on_every_path():
    # through the device path and the host path of the Summarizer: zlib's value, per tensor and in a batch
    gen = torch.Generator().manual_seed(1)
    halves = torch.randn(11, generator=gen).to(torch.bfloat16)
    wide = torch.randn(30, 40, generator=gen)
    cases = [torch.randn(1000, generator=gen), torch.randn(33, dtype=torch.float64).to(torch.bfloat16),
             torch.arange(7), torch.randn(20, 30, generator=gen).t(), halves[1:3], halves[1:4], wide[:, 5:9],
             wide[::3, ::2], torch.tensor(2.5), torch.rand(30, generator=gen) > 0.5,
             torch.randint(0, 200, (13,), dtype=torch.uint8, generator=gen), torch.randn(8, dtype=torch.complex64),
             torch.randn(5000, generator=gen).to(torch.float16), torch.randn(64, generator=gen).to(torch.float8_e4m3fn),
             torch.randn(300_000, generator=gen), torch.zeros(100, dtype=torch.int64)]
    for defer in (False, True):
        s = Summarizer(md5=True, device_path=True)
        got = [s.summarize(t, defer)[0] for t in cases]
        s.start_resolve().finish()
        for i, (t, rec) in enumerate(zip(cases, got)):
            host, _ = Summarizer(md5=True, device_path=False).summarize(t)
            assert rec["md5"] == host["md5"] == _zlib_hex(t), (i, t.dtype, defer)


def test_device_path_statistics_of_every_dtype():
    tensors = [torch.randn(3000), torch.randn(50, dtype=torch.float64), torch.randn(70).to(torch.float16),
               torch.randn(70).to(torch.bfloat16), torch.randint(-9, 9, (40,)), torch.rand(30) > 0.5,
               torch.randn(8, dtype=torch.complex64), torch.empty(0), torch.tensor(2.5),
               torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("inf"), -float("inf")]),
               torch.randn(30, 40)[:, 5:9], torch.randn(6, 7).t()]
    s = Summarizer(device_path=True)
    got = [s.summarize(t)[0] for t in tensors]
    s.start_resolve().finish()
    for t, rec in zip(tensors, got):
        want, _ = Summarizer(device_path=False).summarize(t)
        _same(want, rec, str(t.dtype))


def _every_dtype_batch(gen):
    """Small tensors of every kind the grouped reductions meet, and one too large to group on CPU."""
    wide = torch.randn(30, 40, generator=gen)
    return [torch.randn(300, generator=gen), torch.randn(50, dtype=torch.float64, generator=gen),
            torch.randn(70, generator=gen).to(torch.float16), torch.randn(70, generator=gen).to(torch.bfloat16),
            torch.randint(-9, 9, (40,), generator=gen), torch.rand(30, generator=gen) > 0.5,
            torch.randint(0, 200, (13,), dtype=torch.uint8, generator=gen),
            torch.randn(8, dtype=torch.complex64, generator=gen), torch.tensor(2.5),
            torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("inf"), -float("inf")]),
            torch.tensor([3.0, float("inf")]), wide[:, 5:9], wide.t(), torch.randn(5000, generator=gen),
            torch.randn(64, generator=gen).to(torch.float8_e4m3fn),
            wide.to(torch.bfloat16).reshape(-1)[1:9], wide.to(torch.float16).reshape(-1)[3:6]]


@pytest.mark.parametrize("md5", [False, True])
def test_deferred_batch_in_grouped_reductions_matches_the_host_path(md5):
    # deferred summaries of one launch: small tensors of one dtype reduced together (concatenated, segment
    # reductions), the large and odd-sized ones one by one; every record as the host path writes it
    gen = torch.Generator().manual_seed(3)
    tensors = _every_dtype_batch(gen)
    tensors += [t.clone() for t in tensors]  # two of each dtype in the batch
    s = Summarizer(md5=md5, stats=not md5, device_path=True)
    got = [s.summarize(t, defer=True)[0] for t in tensors]
    assert s.waiting == sum(t.numel() > 0 for t in tensors)
    s.start_resolve().finish()
    for i, (t, rec) in enumerate(zip(tensors, got)):
        want, _ = Summarizer(md5=md5, stats=not md5, device_path=False).summarize(t)
        _same(want, rec, f"{i}:{t.dtype}")


def test_a_tensor_waits_as_one_item_and_a_stage_as_one():
    """Deferred under md5, a tensor's statistics and CRC-32 wait as one item (split into both batches at
    the launch); small tensors summarised at once wait in their staging buffer as one item: the queue
    grows by tensors and stages, not by summaries or rows; every record as the host path writes it."""
    gen = torch.Generator().manual_seed(5)
    deferred = [torch.randn(4, 8, generator=gen) for _ in range(6)]
    deferred += [torch.randn(3, generator=gen).to(torch.float16) for _ in range(2)]
    s = Summarizer(md5=True, device_path=True)
    got = [s.summarize(t, defer=True)[0] for t in deferred]
    assert s.waiting == len(deferred)
    staged = [torch.randn(2, 5, generator=gen) for _ in range(5)]
    got += [s.summarize(t, defer=False)[0] for t in staged]  # statistics staged, the CRC at once
    assert s.waiting == len(deferred) + 1
    # channels-last tensors of one shape: joined, they keep that layout; read in index order all the same
    last = [torch.randn(2, 3, 4, 5, generator=gen).to(memory_format=torch.channels_last) for _ in range(3)]
    got += [s.summarize(t, defer=True)[0] for t in last]
    s.start_resolve().finish()
    for i, (t, rec) in enumerate(zip(deferred + staged + last, got)):
        want, _ = Summarizer(md5=True, device_path=False).summarize(t)
        _same(want, rec, f"{i}:{t.dtype}")


def test_grouped_reductions_span_chunks_and_buffers(monkeypatch):
    # a batch larger than one grouped reduction and one slot buffer: each value lands in its own slot
    from msprobe.pytorch.summary import slots
    monkeypatch.setattr(torch_kernels, "GROUP_TOTAL", 1000)
    monkeypatch.setattr(slots, "SLOTS_PER_BUFFER", 7)
    gen = torch.Generator().manual_seed(4)
    tensors = [torch.randn(int(n), generator=gen) * (i + 1) for i, n in enumerate(torch.randint(1, 300, (40,), generator=gen))]
    s = Summarizer(device_path=True)
    got = [s.summarize(t, defer=True)[0] for t in tensors]
    s.start_resolve().finish()
    for i, (t, rec) in enumerate(zip(tensors, got)):
        _same(Summarizer(device_path=False).summarize(t)[0], rec, str(i))


def test_checksums_of_a_batch_span_several_passes(monkeypatch):
    # tensors of one shape stacked into rows of bytes, a pass holding at most CRC_ROWS rows: a batch of
    # several shapes, some one row, some several, split over passes; each checksum zlib's
    monkeypatch.setattr(torch_kernels, "CRC_ROWS", 5)
    gen = torch.Generator().manual_seed(5)
    tensors = ([torch.randn(300, generator=gen) for _ in range(7)] + [torch.randn(77, generator=gen) for _ in range(3)]
               + [torch.randn(20, 30, generator=gen).t() for _ in range(2)] + [torch.randn(1100, generator=gen)])
    s = Summarizer(md5=True, stats=False, device_path=True)
    got = [s.summarize(t, defer=True)[0] for t in tensors]
    s.start_resolve().finish()
    for i, (t, rec) in enumerate(zip(tensors, got)):
        assert rec["md5"] == _zlib_hex(t), i


TRITON_CHECK = textwrap.dedent('''
    import os
    os.environ["TRITON_INTERPRET"] = "1"  # the CUDA kernels, run by Triton's interpreter on CPU tensors
    import zlib
    import torch
    from msprobe.core import checksum
    from msprobe.pytorch.summary import device, triton_kernels as ts
    from msprobe.pytorch.summary.readback import stats_values
    from msprobe.pytorch.summary.slots import CHECKSUM, Buffer
    from msprobe.pytorch.summary.summarizer import Summarizer
    out = torch.zeros((4, 4), dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    cases = [torch.randn(5000, generator=gen), torch.randn(3, dtype=torch.float64).to(torch.bfloat16),
             torch.randn(9000, generator=gen).to(torch.float16), torch.randn(2049, dtype=torch.float64),
             torch.randint(-50, 50, (100,), dtype=torch.int32), torch.rand(33, generator=gen) > 0.5,
             torch.tensor([1.0, float("nan"), 2.0])]
    for t in cases:
        ts.stats(t, t.numel(), out, 1)
        got = stats_values(out[1].numpy(), t.numel(), t.dtype)
        want, _ = Summarizer(device_path=False).summarize(t)
        for k in ("Max", "Min", "Mean", "Norm"):
            a, b = got[k], want[k]
            assert (a == b) if not isinstance(a, float) else abs(a - b) <= 1e-6 * max(1.0, abs(b)), (t.dtype, k, a, b)
    # a batch in one launch: dense tensors, a chunk of a wider tensor (rows), several tiles, a NaN
    wide = torch.randn(300, 96, generator=gen)
    batch = [torch.randn(5, generator=gen), wide[:, 32:64], torch.randn(3 * ts.TILE + 7, generator=gen),
             torch.tensor([1.0, float("nan")])]
    rows = [(5, 5), (32, 96), (batch[2].numel(), batch[2].numel()), (2, 2)]
    many = torch.zeros((len(batch), 4), dtype=torch.float64)
    ts.stats_many(batch, [t.numel() for t in batch], [many.data_ptr() + 32 * i for i in range(len(batch))], rows)
    for i, t in enumerate(batch):
        got = stats_values(many[i].numpy(), t.numel(), t.dtype)
        want, _ = Summarizer(device_path=False).summarize(t.contiguous())
        for k in ("Max", "Min", "Mean", "Norm"):
            a, b = got[k], want[k]
            assert (a == b) if not isinstance(a, float) else abs(a - b) <= 1e-6 * max(1.0, abs(b)), (i, k, a, b)
    # CRC-32: alone and in one launch, sizes around a row and a tile, equal to zlib's
    sizes = (0, 1, 63, 64, 65, 1000, ts.CRC_TILE, 2 * ts.CRC_TILE + 77)
    raws = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen) for n in sizes]
    buf = Buffer(torch.device("cpu"), CHECKSUM)
    slots = [buf.slot(n, torch.uint8, n) for n in sizes]
    ts.checksum([(raws[1], slots[1])])
    ts.checksum(list(zip(raws, slots)))
    for raw, (_, index) in zip(raws, slots):
        got = checksum.finish_raw(int(buf.rows[index, 0]), raw.numel())
        assert got == f"{zlib.crc32(raw.numpy().tobytes()):08x}", raw.numel()
    # the Summarizer's choice of kernel: slices at any byte offset, one at a time and deferred
    device._triton_kernels = lambda d: ts
    halves = torch.randn(11, generator=gen).to(torch.bfloat16)
    for t in (halves[1:3], halves[2:6], halves[1:], halves):
        for defer in (False, True):
            s = Summarizer(md5=True, device_path=True)
            rec, _ = s.summarize(t, defer)
            s.start_resolve().finish()
            assert rec["md5"] == Summarizer(md5=True).summarize(t)[0]["md5"], (t.storage_offset(), defer)
    print("TRITON OK")
''')



@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, tests/gpu runs the compiled kernels")
def test_triton_kernels_in_the_interpreter():
    pytest.importorskip("triton", reason="Triton is not installed (torch's CPU wheel does not bring it); "
                                         "tests/gpu runs these kernels on CUDA")
    proc = subprocess.run([sys.executable, "-c", TRITON_CHECK], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "TRITON OK" in proc.stdout, proc.stderr[-3000:]


def test_a_change_no_mode_sees_is_reported(tmp_path, monkeypatch, caplog):
    """torch.ops calls reach no TorchFunctionMode: an in-place one on a tensor whose statistics wait for
    a batch launch is caught by its version counter, said once, and logged in dump_error_info.log."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    x = torch.randn(8)
    dbg.start()
    torch.relu(x)
    torch.ops.aten.add_.Tensor(x, 1.0)  # unseen by the API mode
    dbg.stop()
    dbg.step()
    dbg.close()
    (rank,) = find_rank_dirs(str(tmp_path))
    with open(os.path.join(rank.path, "dump_error_info.log"), encoding="utf-8") as f:
        assert "1 tensor(s) changed in place before their deferred statistics were read" in f.read()
    assert any("changed in place" in r.getMessage() for r in caplog.records)


def _resize_to_nothing(t):
    t.untyped_storage().resize_(0)  # how FSDP2 frees a module's gathered parameters


def _replace_data(t):
    t.data = torch.empty(1, dtype=t.dtype)  # how Megatron frees a pipeline stage's output once it is sent


def _replace_data_unseen(t):
    with torch._C.DisableTorchFunction():  # (no mode sees it)
        _replace_data(t)


@pytest.mark.parametrize("free", [_resize_to_nothing, _replace_data_unseen], ids=["resized", "replaced"])
@pytest.mark.parametrize("summary", ["statistics", "md5"])
def test_memory_freed_under_a_waiting_summary_is_not_read(tmp_path, monkeypatch, caplog, summary, free):
    """A tensor's memory freed or replaced where no mode sees it while its statistics wait for a batch
    launch: its fields are null, the others' are read, the step goes on, and it is said once and logged in
    dump_error_info.log. Without the look the launch read freed memory (a segmentation fault under FSDP2)
    or the replacement's (numbers of nothing the model computed)."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    cfg = models.write_config(tmp_path, task="statistics", level="L1", dump_path=str(tmp_path / "dump"),
                              statistics={"summary_mode": summary})
    dbg = PrecisionDebugger(config_path=cfg)
    x = torch.randn(4096, requires_grad=True)  # (a training step's activations wait as they are, not detached)
    dbg.start()
    y = torch.exp(x)
    z = torch.tanh(x)
    free(y)
    dbg.stop()
    dbg.step()
    dbg.close()
    (rank,) = find_rank_dirs(str(tmp_path / "dump"))
    r = DumpReader(rank.path)
    fields = ("Max", "Min", "Mean", "Norm") if summary == "statistics" else ("Max", "Min", "Mean", "Norm", "md5")
    freed = r["Torch.exp.0.forward"]["output"][0]
    assert freed["shape"] == [4096] and all(freed[f] is None for f in fields), freed
    kept = r["Torch.tanh.0.forward"]
    assert kept["output"][0]["Max"] == pytest.approx(z.max().item())
    assert kept["input_args"][0]["Norm"] == pytest.approx(x.detach().norm().item(), rel=1e-6)
    if summary == "md5":
        assert kept["output"][0]["md5"] == checksum.crc32_hex(z.detach().numpy().tobytes())
    with open(os.path.join(rank.path, "dump_error_info.log"), encoding="utf-8") as f:
        assert "1 tensor(s) had their memory freed or replaced before their deferred statistics" in f.read()
    assert sum("freed or replaced" in rec.getMessage() for rec in caplog.records) == 1


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_data_replaced_under_the_api_mode_launches_the_waiting_summary_first(tmp_path, monkeypatch, level):
    """`out.data = torch.empty(1)` on an output whose statistics wait (Megatron, once a pipeline stage's output
    is sent): the API mode sees the setter and launches them first, so the record is of the values."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level=level)
    x = torch.randn(4096, requires_grad=True)
    dbg.start(nn.Identity())  # (mix records a model's modules: one that is not called)
    out = torch.tanh(x) * 2
    want = out.detach().clone()
    _replace_data(out)
    r = _finish_clean(dbg, tmp_path)
    got = r["Tensor.__mul__.0.forward"]["output"][0]
    assert got["shape"] == [4096] and got["Max"] == pytest.approx(want.max().item())
    assert got["Norm"] == pytest.approx(want.norm().item(), rel=1e-6)


def _finish_clean(dbg, dump_path):
    """Stop, step and close `dbg`; the reader of its one rank directory, which logged no error."""
    dbg.stop()
    dbg.step()
    dbg.close()
    (rank,) = find_rank_dirs(str(dump_path))
    assert not os.path.exists(os.path.join(rank.path, "dump_error_info.log"))
    return DumpReader(rank.path)


def test_inplace_calls_launch_the_waiting_summaries_first(tmp_path, monkeypatch):
    """F.relu(x, inplace=True), x.add_(1) and an optimizer step change recorded tensors: the statistics
    recorded before them are of the values before them."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    x = torch.randn(64)
    w = nn.Parameter(torch.randn(64))
    opt = torch.optim.SGD([w], lr=1.0)
    before = (x.max().item(), (x + w).max().item())
    dbg.start()
    y = torch.add(x, w)  # (saves neither input for backward: x may change)
    torch.nn.functional.relu(x, inplace=True)
    x.add_(100.0)
    y.sum().backward()
    opt.step()
    r = _finish_clean(dbg, tmp_path)
    add = r["Torch.add.0.forward"]
    assert add["input_args"][0]["Max"] == pytest.approx(before[0])
    assert add["input_args"][1]["Max"] == pytest.approx(w.detach().max().item() + 1.0)  # before the step
    assert add["output"][0]["Max"] == pytest.approx(before[1])
    assert r["Functional.relu.0.forward"]["input_args"][0]["Max"] == pytest.approx(before[0])


def test_an_inplace_call_launches_only_for_its_own_memory(tmp_path, monkeypatch):
    """The summaries waiting for a batch launch go first when an in-place call may change their memory
    (the tensor, a view of it, an `out=` into it), and keep waiting when it changes other tensors."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    x, y, z, other = torch.randn(64), torch.randn(64), torch.randn(64), torch.zeros(8)
    before = (x.max().item(), y.min().item(), z.max().item())
    dbg.start()
    summarizer = dbg._session.summarizer
    torch.exp(x)
    torch.exp(y)
    torch.exp(z)
    waiting = summarizer.waiting
    other.add_(1.0)  # other memory: nothing launched
    assert summarizer.waiting > waiting
    x[2:5].mul_(100.0)  # a view of x
    torch.neg(torch.ones(64), out=y)
    z.copy_(torch.full((64,), 7.0))
    r = _finish_clean(dbg, tmp_path)
    assert r["Torch.exp.0.forward"]["input_args"][0]["Max"] == pytest.approx(before[0])
    assert r["Torch.exp.1.forward"]["input_args"][0]["Min"] == pytest.approx(before[1])
    assert r["Torch.exp.2.forward"]["input_args"][0]["Max"] == pytest.approx(before[2])
    assert r["Tensor.add_.0.forward"]["output"][0]["Max"] == 1.0


def test_batch_launches_do_not_grow_with_the_model(tmp_path, monkeypatch):
    """A step launches its deferred summaries in a fixed number of batches however many layers the model
    has: the optimizer's update of one parameter (an in-place call) launches only what reads its memory,
    not everything recorded since the update before."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    launches = []

    def counting(kernel):  # a call of a batch kernel: one batch of launches (staging a copy is none)
        def counted(batch):
            launches[-1] += 1
            return kernel(batch)
        return counted
    for name in ("statistics", "row_statistics"):
        monkeypatch.setattr(torch_kernels, name, counting(getattr(torch_kernels, name)))
    for depth in (4, 16):
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(depth)])
        opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)  # an add_ per parameter
        dbg = PrecisionDebugger(dump_path=str(tmp_path / str(depth)), level="L1")
        for _ in range(2):
            launches.append(0)
            dbg.start(model)
            model(torch.randn(4, 16)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            dbg.stop()
            dbg.step()
        dbg.close()
    assert launches[1] == launches[3] <= 4, launches


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_parameter_gradients_are_read_before_clipping(tmp_path, monkeypatch, level):
    """parameters_grad shows each .grad as backward left it, though clipping scales it in place right
    after: at L0 (no API mode to see the clipping) the module's gradients are launched in the hook, at
    mix the clipping's in-place call launches them first."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level=level)
    dbg.start(model)
    model(torch.randn(8, 16)).square().sum().backward()
    norms = {n: p.grad.norm().item() for n, p in model.named_parameters()}
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    r = _finish_clean(dbg, tmp_path)
    got = {}
    for key in r.keys():
        if ".parameters_grad" in key:
            path = key.split(".")[1]
            for name, recs in r[key].items():
                got[f"{path}.{name}"] = recs[0]["Norm"]
    assert set(got) == set(norms)
    for name, norm in norms.items():
        assert got[name] == pytest.approx(norm, rel=1e-5), name


def test_l0_reduces_small_tensors_in_batches(tmp_path, monkeypatch):
    """At L0 (no API mode: nothing may wait past its hook) a module's small tensors are copied into a
    staging buffer in the hook and reduced with the whole stage: a step runs a few batches of reductions,
    not a few per module, and a record holds the values as the hook saw them, though the parent's code
    changes the output in place right after (unseen by any hook)."""
    from msprobe.pytorch.summary import torch_kernels
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    calls = []
    for name in ("statistics", "row_statistics", "_stats_one"):
        real = getattr(torch_kernels, name)

        def counted(*a, _real=real, **k):
            calls[-1] += 1
            return _real(*a, **k)
        monkeypatch.setattr(torch_kernels, name, counted)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            y = self.fc(x)
            y.mul_(1000.0)  # after fc's hook, seen by no hook
            return torch.tanh(y)

    for depth in (4, 16):
        torch.manual_seed(0)
        model = nn.Sequential(*[Block() for _ in range(depth)])
        dbg = PrecisionDebugger(dump_path=str(tmp_path / str(depth)), level="L0")
        calls.append(0)
        dbg.start(model)
        x = torch.randn(4, 16)
        want = model[0].fc(x).detach()
        model(x).square().mean().backward()
        r = _finish_clean(dbg, tmp_path / str(depth))
        out = r["Module.0.fc.Linear.forward.0"]["output"][0]
        assert out["Max"] == pytest.approx(want.max().item(), rel=1e-5)
        assert out["Norm"] == pytest.approx(want.norm().item(), rel=1e-5)
    assert calls[1] <= 8, calls  # (launched one by one: more than 80)


@pytest.mark.parametrize("cap", ["shapes", "rows", "elements"])
def test_staging_buffers_fill_and_start_over(monkeypatch, cap):
    """Small tensors summarised at once go into staging buffers of their dtype and shape; more shapes than a
    lane keeps buffers for, a full buffer, or more staged elements than a lane keeps launch everything and
    start over: each record holds the values as they were when summarised, though they change right after."""
    from msprobe.pytorch.summary import device
    monkeypatch.setattr(device, "_free_stages", {})  # buffers of the sizes set here stay out of other tests
    monkeypatch.setattr(device, "_free_elements", [0])
    monkeypatch.setattr(device, {"shapes": "STAGES_PER_LANE", "rows": "STAGE_ROWS", "elements": "STAGE_TOTAL"}[cap],
                        {"shapes": 3, "rows": 2, "elements": 40}[cap])
    gen = torch.Generator().manual_seed(6)
    tensors = ([torch.randn(i % 5 + 1, 7, generator=gen) for i in range(20)]
               + [torch.randn(3, 3, generator=gen).t(), torch.randint(-5, 5, (6,), generator=gen)])
    s = Summarizer(device_path=True)
    got, want = [], []
    for t in tensors:
        want.append(Summarizer(device_path=False).summarize(t)[0])
        got.append(s.summarize(t)[0])
        t.mul_(100)  # after its summary: not seen by it
    lane = next(iter(s.slots._lanes.values()))
    assert len(lane.stages) <= {"shapes": 3, "rows": 7, "elements": 1}[cap]  # (of 7 dtypes and shapes)
    s.start_resolve().finish()
    for i, (w, rec) in enumerate(zip(want, got)):
        _same(w, rec, str(i))


def test_staging_buffers_are_taken_again_by_the_next_session(monkeypatch):
    """A launched staging buffer goes to a free list and the next session (the next step) takes it from
    there instead of making one: the same buffer both steps, each record right."""
    from msprobe.pytorch.summary import device
    monkeypatch.setattr(device, "_free_stages", {})
    monkeypatch.setattr(device, "_free_elements", [0])
    gen = torch.Generator().manual_seed(7)
    kept = []
    for step in range(2):
        s = Summarizer(device_path=True)
        tensors = [torch.randn(4, 8, generator=gen) for _ in range(5)]
        got = [s.summarize(t)[0] for t in tensors]
        s.start_resolve().finish()
        for i, (t, rec) in enumerate(zip(tensors, got)):
            _same(Summarizer(device_path=False).summarize(t)[0], rec, f"{step}:{i}")
        (free,) = device._free_stages.values()
        assert len(free) == 1 and free[0].used == 0
        kept.append(free[0])
    assert kept[0] is kept[1]


def test_close_lets_the_staging_buffers_go(tmp_path, monkeypatch):
    """The staging buffers a step leaves for the next are process-wide; a debugger's close() frees them:
    device memory held by the tool is the user's again once it is closed."""
    from msprobe.pytorch.summary import device
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    monkeypatch.setattr(device, "_free_stages", {})
    monkeypatch.setattr(device, "_free_elements", [0])
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    for _ in range(2):
        dbg.start(model)
        model(torch.randn(8, 16)).sum().backward()
        dbg.stop()
        dbg.step()
    assert device._free_stages and device._free_elements[0] > 0  # kept between the steps
    dbg.close()
    assert device._free_stages == {} and device._free_elements[0] == 0


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_batch_norm_running_stats_are_recorded_before_the_call_updates_them(tmp_path, monkeypatch, level):
    """BatchNorm2d in training updates its running statistics inside F.batch_norm, with no in-place name
    and no version-counter bump: the device path recorded them after the update (a false alarm of the
    MindSpore/PyTorch migration compare), the host path before."""
    host = _dump(tmp_path / "host", monkeypatch, False, level, "statistics", None, name="cnn")
    device = _dump(tmp_path / "device", monkeypatch, True, level, "statistics", None, name="cnn")
    assert host[0]["Functional.batch_norm.0.forward"]["input_args"][1]["Max"] == 0.0  # zeros before the update
    for step in host:
        for key in host[step].keys():
            _same(host[step][key], device[step][key], key)


def test_calls_that_write_into_arguments_launch_the_waiting_summaries_first(tmp_path, monkeypatch):
    """F.batch_norm / F.instance_norm with running statistics and F.embedding with max_norm change an
    argument in place, however it is passed: its record is of the values before the call."""
    F = torch.nn.functional
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    x = torch.randn(4, 3, 5, 5) + 2.0
    means = [torch.zeros(3) for _ in range(3)]
    weight = torch.randn(10, 4) * 10
    dbg.start()
    F.batch_norm(x, means[0], torch.ones(3), training=True)
    F.instance_norm(x, means[1], torch.ones(3))  # use_input_stats: True by default
    torch.batch_norm(x, None, None, means[2], torch.ones(3), True, 0.1, 1e-5, False)
    F.embedding(torch.tensor([1, 2]), weight, max_norm=1.0)
    r = _finish_clean(dbg, tmp_path)
    assert all(m.max().item() > 0.1 for m in means) and weight.norm(dim=1).min().item() <= 1.0 + 1e-6
    assert r["Functional.batch_norm.0.forward"]["input_args"][1]["Max"] == 0.0
    # (F.instance_norm hands its arguments to the mode as keywords)
    assert r["Functional.instance_norm.0.forward"]["input_kwargs"]["running_mean"]["Max"] == 0.0
    assert r["Torch.batch_norm.0.forward"]["input_args"][3]["Max"] == 0.0
    assert r["Functional.embedding.0.forward"]["input_args"][1]["Norm"] > 10.0


@pytest.mark.parametrize("device_path", [False, True])
def test_a_second_batch_norm_call_in_a_step_records_the_running_stats_it_is_given(tmp_path, monkeypatch,
                                                                                 device_path):
    """Two micro-batches through one BatchNorm in a step: the second call is handed the running statistics
    the first one wrote, which no version bump marks as changed; its record must not be the first call's."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1" if device_path else "0")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    x = torch.randn(2, 3, 8, 8)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    dbg.start(model)
    given = []
    for i in range(2):
        given.append(model[1].running_mean.max().item())
        model(x + i).sum().backward()
    r = _finish_clean(dbg, tmp_path)
    assert given[0] == 0.0 and given[1] > 0.01
    for i in range(2):
        assert r[f"Functional.batch_norm.{i}.forward"]["input_args"][1]["Max"] == pytest.approx(given[i], rel=1e-6)


def _writer_cases():
    F = torch.nn.functional
    x, idx, off = torch.randn(4, 3, 5, 5) + 2.0, torch.tensor([1, 2]), torch.tensor([0])
    stats = lambda: (torch.zeros(3), torch.ones(3))  # noqa: E731
    cases = []
    for f, first in ((F.batch_norm, 1), (F.instance_norm, 1), (torch.batch_norm, 3), (torch.native_batch_norm, 3),
                     (torch.instance_norm, 3)):
        flag = "training" if "batch" in f.__name__ else "use_input_stats"
        extra = (0.1, 1e-5, False) if f in (torch.batch_norm, torch.instance_norm) else (0.1, 1e-5)
        for on in (True, False):
            mean, var = stats()
            args = (x, mean, var, None, None) if first == 1 else (x, None, None, mean, var)
            cases.append((f, args + (on,) + extra, {}, mean, on))
    for given in (True, False):
        mean, var = stats() if given else (None, None)
        cases.append((torch.batch_norm_update_stats, (x, mean, var, 0.1), {}, mean, given))
    for f, extra in ((F.embedding, ()), (F.embedding_bag, (off,))):
        for max_norm in (1.0, None):
            weight = torch.randn(10, 4) * 10
            cases.append((f, (idx, weight) + extra, {"max_norm": max_norm}, weight, max_norm is not None))
    low, high = torch.tensor(float("inf")), torch.tensor(float("-inf"))  # the observer's running min/max
    on = torch.tensor([1])
    cases.append((torch.fused_moving_avg_obs_fake_quant, (torch.randn(16), on, on, low, high, torch.tensor([1.0]),
                                                           torch.tensor([0], dtype=torch.int32), 0.01, 0, 255, 0),
                  {}, low, True))
    return cases


def test_argument_writers_name_the_calls_that_change_their_arguments():
    """api_table.argument_writers says a call writes into an argument exactly when it does (checked by
    value: batch norm leaves the version counter as it is)."""
    from msprobe.pytorch.capture.api_table import argument_writers
    writers = argument_writers()
    for f, args, kwargs, written, writes in _writer_cases():
        before = None if written is None else written.clone()
        assert writers[f](args, kwargs) is writes, (f.__name__, writes)
        f(*args, **kwargs)
        assert written is None or (not torch.equal(before, written)) is writes, (f.__name__, writes)
    # SyncBatchNorm's gather steps run on CUDA only (tests/gpu runs them): what they are handed decides
    x, stat = torch.randn(4, 3, 5, 5), torch.zeros(1, 3)
    for f in (torch.batch_norm_gather_stats, torch.batch_norm_gather_stats_with_counts):
        assert writers[f]((x, stat, stat, torch.zeros(3), torch.ones(3), 0.1, 1e-5, 4), {}) is True
        assert writers[f]((x, stat, stat, None, None, 0.1, 1e-5, 4), {}) is False


class _ChangesWhatItRecorded(nn.Module):
    def forward(self, x):
        y = torch.exp(x)
        x.add_(100.0)
        return torch.nn.functional.relu(y.sub_(1e6), inplace=True)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_an_inplace_call_the_list_leaves_out_launches_the_waiting_summaries_first(tmp_path, monkeypatch, level):
    """`list` names exp only: x.add_ and F.relu(inplace=True) are not recorded, yet they change the tensors
    whose recorded statistics still wait for a batch launch; those are of the values before them."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    cfg = models.write_config(tmp_path, task="statistics", level=level, dump_path=str(tmp_path / "dump"),
                              statistics={"list": ["Torch.exp"]})
    dbg = PrecisionDebugger(config_path=cfg)
    model = _ChangesWhatItRecorded()
    x = torch.randn(64)
    before = (x.max().item(), x.exp().min().item())
    dbg.start(model)
    model(x)
    r = _finish_clean(dbg, tmp_path / "dump")
    assert list(r.keys()) == ["Torch.exp.0.forward"]
    assert r["Torch.exp.0.forward"]["input_args"][0]["Max"] == pytest.approx(before[0])
    assert r["Torch.exp.0.forward"]["output"][0]["Min"] == pytest.approx(before[1])


def _accumulated_dump(path, monkeypatch, device_path, level):
    """Two micro-batches' backward passes into the same `.grad` tensors, then one optimizer step."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1" if device_path else "0")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 8, 16)
    dbg = PrecisionDebugger(dump_path=str(path), level=level)
    dbg.start(model)
    for micro in x:
        model(micro).square().mean().backward()
    opt.step()
    return _finish_clean(dbg, path)


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_gradient_accumulation_records_each_backward_pass_before_the_next_adds_into_it(tmp_path, monkeypatch,
                                                                                        level):
    """The second backward adds into the `.grad` tensors the first one's records are of: on the device path
    those records waited for a batch launch, and read the sums (logged as changed in place)."""
    host = _accumulated_dump(tmp_path / "host", monkeypatch, False, level)
    device = _accumulated_dump(tmp_path / "device", monkeypatch, True, level)
    assert list(host.keys()) == list(device.keys())
    for key in host.keys():
        _same(host[key], device[key], key)


class _CountOps(TorchDispatchMode):
    """How many times each aten op ran while active."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def test_l0_parameter_gradients_wait_for_the_batch_launched_as_the_backward_pass_ends(tmp_path, monkeypatch):
    """At L0 no API is intercepted, yet `.grad` changes in place only once its backward pass has ended
    (clipping, the next micro-batch): each parameter's summary joins the batch launched as the pass ends,
    not a copy (on a GPU, a launch) of its own in the middle of the pass; the records are of the values
    before the clipping that follows."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(3, 16)
    plain = _CountOps()  # (torch's own copies in this backward pass, if any)
    with plain:
        model(x).square().mean().backward()
    model.zero_grad(set_to_none=True)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    dbg.start(model)
    loss = model(x).square().mean()
    counting = _CountOps()
    with counting:
        loss.backward()
    want = {i: (model[i].weight.grad.max().item(), model[i].bias.grad.norm().item()) for i in (0, 2, 4)}
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)  # in place, and unseen at L0
    r = _finish_clean(dbg, tmp_path)
    assert counting.ops["aten.copy_.default"] == plain.ops["aten.copy_.default"], counting.ops
    for i, (top, norm) in want.items():
        got = r[f"Module.{i}.Linear.parameters_grad.0"]
        assert got["weight"][0]["Max"] == pytest.approx(top) and got["bias"][0]["Norm"] == pytest.approx(norm)


def _same_value(a, b):
    """Equal as the dump writes them: the same type, and the same float to the bit (NaN too)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    return a == b


def test_rows_filled_in_c_equal_the_python_fill():
    """msprobe._record's fill of statistics rows gives the record fields readback's numpy fill gives, value
    for value and type for type, over every reporting case: float64, floats in float32 (rounded within
    float32's range, left beyond it), integers, bools, NaN and inf in any column."""
    from msprobe.pytorch.summary import readback
    pytest.importorskip("msprobe._record", reason="msprobe._record not built (no C compiler)")
    dtypes = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.uint8,
              torch.bool]
    special = [0.0, -0.0, 1.5, -3.25, 1e-30, 0.1, 3.4028234663852886e38, 3.5e38, -1e300, 1e300, 2.0 ** 53 + 2,
               math.inf, -math.inf, math.nan]
    gen = torch.Generator().manual_seed(3)
    k = 4000
    rows = torch.randn((k, 4), dtype=torch.float64, generator=gen) * 10.0 ** torch.randint(-5, 40, (k, 1), generator=gen)
    pick = torch.randint(0, len(special), (k, 4), generator=gen)
    use = torch.rand((k, 4), generator=gen) < 0.2  # a fifth of the values special
    rows = torch.where(use, torch.tensor(special, dtype=torch.float64)[pick], rows)
    rows[::7, 3] = rows[::7, 3].abs()  # a sum of squares, mostly
    ns = torch.randint(1, 10 ** 7, (k,), generator=gen).tolist()
    kinds = [dtypes[i % len(dtypes)] for i in range(k)]
    want = [{} for _ in range(k)]
    readback.fill_stats(want, ns, kinds, rows.numpy())
    got = [{} for _ in range(k)]
    readback._fill_stats_c(got, ns, kinds, readback.CODES, rows.data_ptr())
    for i in range(k):
        assert list(got[i]) == ["Max", "Min", "Mean", "Norm"]
        for field in got[i]:
            assert _same_value(got[i][field], want[i][field]), (i, kinds[i], rows[i].tolist(), field, got[i], want[i])
    # the records waiting for a row get its fields; bad arguments are errors, not a crash
    waiting = [(3, {"type": "torch.Tensor"}), (0, {})]
    readback._fill_waiting_c(got, waiting)
    assert waiting[0][1] == {"type": "torch.Tensor", **got[3]} and waiting[1][1] == got[0]
    with pytest.raises(IndexError):
        readback._fill_waiting_c(got, [(k, {})])
    with pytest.raises(TypeError):
        readback._fill_waiting_c(got, [(0, "not a dict")])
    with pytest.raises(ValueError):
        readback._fill_stats_c([{}], ns[:2], kinds[:2], readback.CODES, rows.data_ptr())
    with pytest.raises(ValueError):
        readback._fill_stats_c([{}], [5], ["not a dtype"], readback.CODES, rows.data_ptr())

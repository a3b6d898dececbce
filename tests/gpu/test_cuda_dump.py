"""The dump on CUDA: the same records as the CPU dump of the same model, checksums equal across devices,
the Triton kernels against the host path, and no device->host read per API call.

Skipped without CUDA (CI has none); run on a GPU machine: `python -m pytest tests/gpu` (benchmarks/README.md).
"""

import json
import math
import time
import zlib

import numpy as np
import pytest
import torch
from torch import nn

from msprobe.core.dump.reader import DumpReader, find_rank_dirs
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.summary.summarizer import Summarizer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device: run on a GPU machine (benchmarks/README.md)")

LEVELS = ("L0", "L1", "mix")
TASKS = (("statistics", None), ("statistics", "md5"), ("tensor", None), ("overflow_check", None))


class Net(nn.Module):
    def __init__(self, width_in=32):
        super().__init__()
        self.l1 = nn.Linear(width_in, 64)
        self.ln = nn.LayerNorm(64)
        self.l2 = nn.Linear(64, 8)

    def forward(self, x):
        h = torch.relu(self.ln(self.l1(x)))
        return torch.softmax(self.l2(h), dim=-1)


@pytest.fixture(autouse=True)
def exact_cuda():
    """No TF32: CUDA's float32 matmuls then match the CPU's within float32 rounding."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _debugger(path, task, level, summary):
    """A debugger from a config.json at `{path}.json` dumping to `path` (`summary`: its summary_mode)."""
    cfg = {"task": task, "level": level, "dump_path": str(path)}
    if summary:
        cfg[task] = {"summary_mode": summary}
    with open(f"{path}.json", "w") as f:
        json.dump(cfg, f)
    return PrecisionDebugger(config_path=f"{path}.json")


def _dump(path, device, level, task, summary):
    torch.manual_seed(0)
    net = Net().to(device)
    if task == "overflow_check":
        with torch.no_grad():
            net.l2.weight[0, 0] = float("inf")
    opt = torch.optim.SGD(net.parameters(), lr=0.1, foreach=False)  # CUDA's default is foreach: other APIs
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1)).to(device)
    dbg = _debugger(path, task, level, summary)
    for _ in range(2):
        dbg.start(net)
        net(x).square().sum().backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
    dbg.close()
    return {r.step: DumpReader(r.path) for r in find_rank_dirs(str(path))}


def _close(a, b, path, md5_same):
    if isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            if k == "md5":
                if md5_same:
                    assert a[k] == b[k], path
                continue
            if k == "data_name":
                continue
            _close(a[k], b[k], f"{path}.{k}", md5_same)
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]", md5_same)
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5), (path, a, b)
    elif isinstance(a, str) and isinstance(b, str) and a.startswith("cuda"):
        pass
    else:
        assert a == b or {a, b} <= {"cpu", "cuda:0"}, (path, a, b)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("task,summary", TASKS)
@pytest.mark.parametrize("kernels", ["triton", "torch"])
def test_cuda_dump_equals_cpu_dump(tmp_path, monkeypatch, level, task, summary, kernels):
    """Triton's kernels, and torch's reductions (the path without Triton: grouped when small)."""
    if kernels == "torch":
        from msprobe.pytorch.summary import device
        monkeypatch.setattr(device, "_TRITON_OFF", True)
    cpu = _dump(tmp_path / "cpu", "cpu", level, task, summary)
    gpu = _dump(tmp_path / "gpu", "cuda", level, task, summary)
    assert sorted(cpu) == sorted(gpu) and cpu
    for step in cpu:
        assert list(cpu[step].keys()) == list(gpu[step].keys())
        for key in cpu[step].keys():
            a, b = cpu[step][key], gpu[step][key]
            _close(a, b, key, md5_same=False)
            if step == 0 and isinstance(a, dict) and "parameters" in a:
                # a module's parameters are the same bytes on both devices before the first update
                _close(a["parameters"], b["parameters"], key, md5_same=True)


def test_checksum_equal_across_devices():
    gen = torch.Generator().manual_seed(0)
    for t in (torch.randn(1 << 20, generator=gen), torch.randn(1000, generator=gen).to(torch.bfloat16),
              torch.randint(0, 100, (4099,), generator=gen), torch.randn(3, generator=gen).to(torch.float16),
              torch.rand(77, generator=gen) > 0.5):
        host, _ = Summarizer(md5=True).summarize(t)
        s = Summarizer(md5=True)
        dev, _ = s.summarize(t.cuda())
        s.start_resolve().finish()
        want = f"{zlib.crc32(t.reshape(-1).view(torch.uint8).numpy().tobytes()):08x}"  # msProbe's value
        assert dev["md5"] == host["md5"] == want, t.dtype


def test_deferred_batches_on_cuda_match_the_host_path():
    """Many tensors of few shapes deferred into one launch per dtype (views and non-contiguous ones among
    them): statistics and checksums equal to the host path's."""
    gen = torch.Generator().manual_seed(2)
    wide = torch.randn(40, 96, generator=gen)
    cases = [torch.randn(4, 32, generator=gen) for _ in range(20)] + [torch.randn(300, generator=gen) for _ in range(5)]
    cases += [wide[:, 32:64], wide.t(), wide.to(torch.bfloat16)[3:9], torch.randint(0, 9, (13,), generator=gen)]
    s = Summarizer(md5=True)
    got = [s.summarize(t.cuda(), defer=True)[0] for t in cases]
    s.start_resolve().finish()
    for i, (t, rec) in enumerate(zip(cases, got)):
        want, _ = Summarizer(md5=True).summarize(t)
        assert rec["md5"] == want["md5"], i
        for k in ("Max", "Min", "Mean", "Norm"):
            a, b = rec[k], want[k]
            assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6) if isinstance(b, float) else a == b, (i, k, a, b)


def test_tables_go_through_reused_pinned_buffers():
    """Kernel tables are copied from a few pinned buffers reused once their copy is done: every copy
    arrives intact, and the buffers kept stay few."""
    from msprobe.pytorch.summary import transfer
    staging, device = transfer.PinnedStaging(), torch.device("cuda")
    big = torch.randn(4096, 4096, device=device)
    sent = []
    for i in range(300):
        if i % 50 == 0:
            big = big @ big / 64  # queued work: some copies are still waiting when the next table is made
        values = np.arange(i, i + 37 + i % 5, dtype=np.int64)
        sent.append((values, staging.to_device(values, device)))
    torch.cuda.synchronize()
    for values, out in sent:
        assert out.cpu().tolist() == values.tolist()
    assert len(staging._buffers[device]) <= staging.KEEP


def test_triton_statistics_match_the_host_path_on_every_dtype_and_size():
    pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(0)
    cases = []
    for n in (1, 7, 2048, 2049, 100_000, 5_000_000):
        base = torch.randn(n, generator=gen, dtype=torch.float64)
        cases += [base.float(), base.to(torch.bfloat16), base.to(torch.float16), base]
    cases += [torch.randint(-1000, 1000, (30_000,), generator=gen), torch.rand(10_000, generator=gen) > 0.3,
              torch.tensor([1.0, float("nan"), 3.0]), torch.tensor([1.0, float("inf")]),
              torch.randn(64, 96, generator=gen).t()]
    s = Summarizer()
    got = [s.summarize(t.cuda())[0] for t in cases]
    s.start_resolve().finish()
    for t, rec in zip(cases, got):
        want, _ = Summarizer().summarize(t)
        for k in ("Max", "Min", "Mean", "Norm"):
            a, b = rec[k], want[k]
            if isinstance(b, float) and isinstance(a, float):
                assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6), (t.dtype, t.numel(), k, a, b)
            else:
                assert a == b, (t.dtype, t.numel(), k, a, b)


def test_no_read_back_per_call_on_cuda(tmp_path, monkeypatch):
    """Deeper model, as many reads: the copies are per resolve (stop() and step()), not per call."""
    reads = {}
    for depth in (2, 6):
        net = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(depth)]).cuda()
        x = torch.randn(8, 64, device="cuda")
        dbg = PrecisionDebugger(dump_path=str(tmp_path / str(depth)), level="mix")
        dbg.start(net)
        net(x).sum().backward()
        dbg.stop()
        dbg.step()  # the first step builds the API table and compiles kernels
        count = [0]
        for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__"):
            orig = getattr(torch.Tensor, name)

            def wrapper(*a, _orig=orig, **k):
                count[0] += 1
                return _orig(*a, **k)
            monkeypatch.setattr(torch.Tensor, name, wrapper)
        syncs = [0]
        orig_sync = torch.cuda.Event.synchronize
        monkeypatch.setattr(torch.cuda.Event, "synchronize",
                            lambda self: (syncs.__setitem__(0, syncs[0] + 1), orig_sync(self))[1])
        dbg.start(net)
        net(x).sum().backward()
        dbg.stop()
        dbg.step()
        monkeypatch.undo()
        dbg.close()
        reads[depth] = (count[0], syncs[0])
    assert reads[2] == reads[6] and reads[2][0] <= 2 and reads[2][1] <= 4, reads


class InPlaceNet(Net):
    """In-place calls in forward (a residual `+=`, `mul_` on a slice) between recorded ones."""

    def __init__(self):
        super().__init__(width_in=64)

    def forward(self, x):
        h = self.l1(x)
        h += x
        h[:, :8].mul_(0.5)
        return self.l2(torch.nn.functional.gelu(self.ln(h)))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("summary", ["statistics", "md5"])
@pytest.mark.parametrize("kernels", ["triton", "torch"])
def test_capture_makes_no_synchronizing_call(tmp_path, monkeypatch, level, summary, kernels):
    """Between start() and stop() nothing msprobe does waits for the device: torch's sync debug mode
    raises on any synchronizing call (a read, a blocking copy in either direction, a size read back)."""
    from msprobe.pytorch.summary import device
    if kernels == "torch":
        monkeypatch.setattr(device, "_TRITON_OFF", True)
    net = InPlaceNet().cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(16, 64, device="cuda")
    dbg = _debugger(tmp_path / "dump", "statistics", level, summary)
    for step in range(2):  # the first builds the API table and compiles the kernels
        dbg.start(net)
        torch.cuda.set_sync_debug_mode("error" if step else "default")
        try:
            net(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        dbg.stop()
        dbg.step()
    dbg.close()
    last = max(find_rank_dirs(str(tmp_path / "dump")), key=lambda r: r.step)
    assert len(DumpReader(last.path).keys()) > 5


def test_sync_batch_norm_gather_steps_are_argument_writers():
    """SyncBatchNorm's gather steps update the running statistics they are handed: api_table.argument_writers
    must name them (the CPU test checks only what they are handed)."""
    from msprobe.pytorch.capture.api_table import argument_writers
    writers = argument_writers()
    x = torch.randn(4, 3, 5, 5, device="cuda") + 2.0
    mean, invstd = torch.batch_norm_stats(x, 1e-5)
    for f, extra in ((torch.batch_norm_gather_stats, (0.1, 1e-5, x.numel() // 3)),
                     (torch.batch_norm_gather_stats_with_counts, (0.1, 1e-5, torch.tensor([x.numel() // 3.0],
                                                                                          device="cuda")))):
        running_mean, running_var = torch.zeros(3, device="cuda"), torch.ones(3, device="cuda")
        args = (x, mean.unsqueeze(0), invstd.unsqueeze(0), running_mean, running_var) + extra
        assert writers[f](args, {}) is True
        f(*args)
        assert running_mean.abs().sum().item() > 0, f.__name__


@pytest.mark.parametrize("level", LEVELS)
def test_the_records_are_on_disk_as_the_backward_pass_ends(tmp_path, level):
    """CUDA's backward runs on autograd's device thread, whose end-of-backward callback launches, reads
    back (non-blocking, an event) and hands the write to the lane thread: dump.json holds the step's
    records soon after backward() returns, with no stop() (a process killed or hung then keeps them),
    and their values are those the finished step writes."""
    torch.manual_seed(0)
    net = Net().cuda()
    x = torch.randn(16, 32, device="cuda")
    dbg = _debugger(tmp_path / "dump", "statistics", level, None)
    dbg.start(net)
    net(x).square().sum().backward()
    stuck = {t.key for t in dbg._session.trackers}
    path, written = None, {}
    for _ in range(100):  # the lane writes once the device has run the copies
        dirs = find_rank_dirs(str(tmp_path / "dump"))
        if dirs:
            path = dirs[0].path
            try:
                with open(f"{path}/dump.json", encoding="utf-8") as f:
                    written = json.load(f)["data"]
            except ValueError:  # read while the lane was writing
                written = {}
            if any(k.endswith(".backward") or ".backward." in k for k in written):
                break
        time.sleep(0.05)
    dbg.stop()
    dbg.step()
    dbg.close()
    final = DumpReader(path)
    assert list(written) == [k for k in final.keys() if k not in stuck]
    for k in written:
        _close(written[k], final[k], k, True)

"""An input a call reads along several edges (GPT-2's GELU reads its input three times, a residual block
twice) has as its gradient the sum of what the edges bring. On the host path its record is read in one
pass over the parts (`msprobe._moments.moments_of_sum`) instead of adding them up first: the numbers must
be the added-up tensor's own, to the last bit."""

import math

import pytest
import torch
from torch import nn

from msprobe.core.dump import moments as native
from msprobe.core.dump.reader import DumpReader, find_rank_dirs
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.summary.summarizer import Summarizer
import msprobe_test_models as models  # loaded by conftest.py

pytestmark = pytest.mark.skipif(native.sum_kernel is None, reason="msprobe._moments not built")


@pytest.mark.parametrize("n", [2, 15, 16, 17, 129, 4099, 300_001])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_the_sum_kernel_reads_what_adding_up_gives(n, k, kernel_loop):
    gen = torch.Generator().manual_seed(n * 10 + k)
    parts = [torch.randn(n, generator=gen) * 10.0 ** (i - 2) for i in range(k)]
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    for threads in (1, 2, 3):
        want = native.kernel(total.data_ptr(), n, native.KINDS["float32"], threads)
        got = native.sum_kernel(tuple(p.data_ptr() for p in parts), n, threads)
        assert got == want


def test_the_sum_kernel_leaves_a_nan_to_torch_and_refuses_bad_arguments():
    a, b = torch.randn(100), torch.randn(100)
    b[7] = math.nan
    assert native.sum_kernel((a.data_ptr(), b.data_ptr()), 100, 1) is None
    with pytest.raises(ValueError, match="1..8 addresses"):
        native.sum_kernel(tuple([a.data_ptr()] * 9), 100, 1)
    with pytest.raises(ValueError, match="count > 0"):
        native.sum_kernel((a.data_ptr(),), 0, 1)
    with pytest.raises(ValueError, match="zero"):
        native.sum_kernel((a.data_ptr(), 0), 100, 1)


@pytest.mark.usefixtures("host_path")
def test_sum_record_takes_only_what_the_host_kernel_reads():
    s = Summarizer()
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    rec = s.sum_record((a, b))
    assert rec == s.record(a + b)
    assert s.sum_record((a, b.t().contiguous().t())) is None  # a transposed part
    assert s.sum_record((a, b.double())) is None
    assert s.sum_record((a, torch.randn(8, 4))) is None
    assert s.sum_record((a,)) is None
    assert Summarizer(md5=True).sum_record((a, b)) is None  # the CRC reads the sum's bytes
    assert Summarizer(device_path=True).sum_record((a, b)) is None


class NewGELU(nn.Module):
    """GPT-2's activation: its input is read three times."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Block(nn.Module):
    """A residual block: its input is read by the norm and by the residual add."""

    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.act = NewGELU()
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.up(self.norm(x))
        h.retain_grad()  # the act's input: its gradient is what the act's backward record must hold
        self.act_in = h
        return x + self.down(self.act(h))


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), Block(32), Block(32), nn.Linear(32, 4))


def _dump(root, level, net, dbg=None, steps=2):
    """{step: dump.json's data} of `steps` training steps of `net` under `dbg` (default: statistics at `level`)."""
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    dbg = dbg or PrecisionDebugger(dump_path=str(root), level=level, task="statistics")
    try:
        for _ in range(steps):
            dbg.start(net)
            net(x).square().mean().backward()
            dbg.stop()
            dbg.step()
    finally:
        models.finish(dbg)
    return {rd.step: DumpReader(rd.path).data for rd in find_rank_dirs(str(root))}


@pytest.mark.usefixtures("host_path")
@pytest.mark.parametrize("level", ["L0", "mix"])
def test_a_gradient_read_without_its_sum_in_memory_is_the_sums_record(tmp_path, monkeypatch, level):
    summed = []
    fused = Summarizer.sum_record

    def spy(self, parts):
        got = fused(self, parts)
        summed.append((len(parts), got is not None))
        return got

    monkeypatch.setattr(Summarizer, "sum_record", spy)
    net = _net()
    one_pass = _dump(tmp_path / "one_pass", level, net)
    # each GELU's input (three edges) and each block's (two), in both steps, read in one pass
    assert summed.count((3, True)) == 4 and summed.count((2, True)) == 4, summed
    monkeypatch.setattr(Summarizer, "sum_record", lambda self, parts: None)  # added up, then recorded
    added = _dump(tmp_path / "added", level, _net())
    assert one_pass == added
    # against autograd's own: the act's input feeds nothing else, so its .grad is the act's input gradient
    gelu = one_pass[1]["Module.1.act.NewGELU.backward.0"]["output"][0]
    assert gelu == Summarizer().record(net[1].act_in.grad) and gelu["shape"] == [8, 128]


@pytest.mark.parametrize("summary_mode", ["md5", "statistics"])
def test_where_a_sum_is_added_up_anyway_one_tensor_is_held_not_each_part(tmp_path, monkeypatch, summary_mode):
    """On the device path, with md5 or tensor files the sum is added up: as the parts come, so that a tracker
    holds one gradient-sized tensor, not one a part (device memory); the records are the added-up sum's."""
    import json

    from msprobe.pytorch.capture import backward

    held = []
    with_part = backward.BackwardTracker._with_part

    def spy(self, parts, g):
        got = with_part(self, parts, g)
        held.append(len(got))
        return got

    monkeypatch.setattr(backward.BackwardTracker, "_with_part", spy)
    if summary_mode == "statistics":
        monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")  # the accelerator's path, on the CPU
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(tmp_path / "dump"),
                               "statistics": {"summary_mode": summary_mode}}))
    net = _net()
    data = _dump(tmp_path / "dump", "L0", net, PrecisionDebugger(config_path=str(cfg)), steps=1)[0]
    assert held and max(held) == 1  # (each GELU's three parts: never more than one tensor held)
    gelu = data["Module.1.act.NewGELU.backward.0"]["output"][0]
    want = Summarizer(md5=summary_mode == "md5", device_path=False).record(net[1].act_in.grad)
    assert {k: gelu[k] for k in want} == want

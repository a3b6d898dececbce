"""msprobe overflow_check on real dumps: PyTorch models that overflow in one known op, msProbe's sample,
a tensor dump without statistics, and a 2-rank gloo run where all_reduce spreads rank 1's inf."""

from pathlib import Path
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from msprobe.core.errors import DumpFormatError, MsprobeError  # noqa: E402
from msprobe.core.overflow import analyze_overflow  # noqa: E402
from msprobe.core.overflow.report import NO_ANOMALY, write_analysis_json  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402

SAMPLES = str(Path(__file__).resolve().parents[1] / "data" / "msprobe-samples/overflow")


class ExpNet(nn.Module):
    """linear -> relu -> exp(100 h): exp overflows to inf when `scale` makes h large enough."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x, scale):
        h = torch.relu(self.fc(x))
        h = torch.exp(h * scale)
        return self.head(h)


def train(dump_path, level, scales, task="statistics", model=None):
    """One training step per entry of `scales` under PrecisionDebugger; returns the dump root."""
    torch.manual_seed(0)
    model = model or ExpNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    debugger = PrecisionDebugger(dump_path=str(dump_path), level=level, task=task)
    try:
        for scale in scales:
            debugger.start(model)
            loss = model(torch.randn(4, 8), scale).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            debugger.stop()
            debugger.step()
    finally:
        debugger.close()
    return dump_path


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_exp_overflow_is_named_first(tmp_path, level):
    root = train(tmp_path / "dump", level, [100.0])
    result = analyze_overflow(str(root))
    assert not result  # __bool__ is "clean"
    culprit = result.culprit
    assert culprit.key == "Torch.exp.0.forward" and culprit.kind == "origin" and culprit.step == 0
    assert re.fullmatch(r"proc\d+", culprit.label)  # no process group: the proc{pid} directory's name
    assert any("torch.exp(h * scale)" in line for line in culprit.stack)
    if level == "mix":  # the relu/exp are outside any submodule; the head's linear comes later with nan
        assert culprit.construct == ["Torch.exp.0.forward"]


def test_overflow_in_a_later_step(tmp_path):
    """Steps 0 and 1 are finite; step 2 overflows: step 2 is reported, not an earlier one."""
    root = train(tmp_path / "dump", "L1", [0.1, 0.1, 100.0, 100.0])
    culprit = analyze_overflow(str(root)).culprit
    assert (culprit.step, culprit.key) == (2, "Torch.exp.0.forward")


def test_fp16_matmul_overflow_inside_module_mix(tmp_path):
    """An fp16 matmul of finite values exceeds 65504: the API inside the module is named, not the module."""

    class Half(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(64, 64).half()
            nn.init.constant_(self.proj.weight, 0.05)  # all-positive: each output is about 0.05 * 64 * x

        def forward(self, x, scale):
            return torch.matmul(self.proj(x.half() * scale), torch.full((64, 4), 300.0, dtype=torch.half))

    torch.manual_seed(0)
    model = Half()
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="mix")
    try:
        debugger.start(model)
        with torch.no_grad():
            model(torch.rand(2, 64) + 1.0, 4.0)
        debugger.stop()
        debugger.step()
    finally:
        debugger.close()
    culprit = analyze_overflow(str(tmp_path / "d")).culprit
    assert culprit.key == "Torch.matmul.0.forward", culprit.key
    out = culprit.record["output"][0]
    assert out["dtype"] == "torch.float16" and out["Max"] == "inf"


def test_backward_origin(tmp_path):
    """sqrt(0) is finite but its gradient is inf: the backward record of sqrt is the origin."""

    class Sqrt(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x, scale):
            return torch.sqrt(torch.relu(self.fc(x)) * scale)

    root = train(tmp_path / "dump", "L1", [1.0], model=Sqrt())
    culprit = analyze_overflow(str(root)).culprit
    assert culprit.key == "Torch.sqrt.0.backward", culprit.key


def test_minus_inf_attention_mask_is_not_an_anomaly(tmp_path):
    """masked_fill(-inf) before softmax is intended: a clean run is reported clean."""

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.q = nn.Linear(8, 8)

        def forward(self, x, scale):
            s = self.q(x) @ x.transpose(-1, -2)
            mask = torch.ones(4, 4, dtype=torch.bool).triu(1)
            return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ x

    root = train(tmp_path / "dump", "L1", [1.0], model=Attn())
    result = analyze_overflow(str(root))
    assert result and result.culprit is None
    assert json.load(open(write_analysis_json(result, str(tmp_path / "out")))) == {}


def test_nan_in_the_input_batch_is_inherited(tmp_path):
    """No op turns finite into non-finite: the first node holding nan is reported as inherited."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "d"), level="L1")
    try:
        debugger.start()
        model(torch.tensor([[1.0, float("nan"), 0.0, 2.0]])).sum().backward()
        debugger.stop()
        debugger.step()
    finally:
        debugger.close()
    culprit = analyze_overflow(str(tmp_path / "d")).culprit
    assert (culprit.key, culprit.kind) == ("Functional.linear.0.forward", "inherited")


def test_msprobe_statistics_sample(tmp_path):
    """msProbe's statistics dump (bare Infinity/NaN tokens) gives the same node as msProbe's analysis."""
    with open(os.path.join(SAMPLES, "overflow_check_anomaly_analyze_statistics_L1.json")) as f:
        expected = json.load(f)
    rank_dir = tmp_path / "step0" / "rank0"
    rank_dir.mkdir(parents=True)
    shutil.copy(os.path.join(SAMPLES, "ovf_statistics_L1_dump.json"), rank_dir / "dump.json")
    for root in (tmp_path, os.path.join(SAMPLES, "ovf_statistics_L1_dump.json")):
        out = analyze_overflow(str(root)).by_label()
        assert list(out) == list(expected) == ["rank_0"]
        mine, theirs = out["rank_0"][0], expected["rank_0"][0]
        assert mine["op_name"] == theirs["op_name"] == "Torch.exp.0.forward"
        assert mine["data_info"]["input_args"][0]["Max"] == theirs["data_info"]["input_args"][0]["Max"]
        assert set(theirs) <= set(mine)  # every field msProbe writes is there


def test_tensor_dump_without_statistics_reads_the_data(tmp_path):
    """A tensor dump whose records carry no Max/Min is judged from the saved arrays."""
    root = train(tmp_path / "dump", "L1", [100.0], task="tensor")
    [rank] = [os.path.join(root, "step0", d) for d in os.listdir(root / "step0")]
    with open(os.path.join(rank, "dump.json")) as f:
        doc = json.load(f)

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in ("Max", "Min", "Mean", "Norm")}
        return [strip(x) for x in v] if isinstance(v, list) else v
    doc["data"] = strip(doc["data"])
    with open(os.path.join(rank, "dump.json"), "w") as f:
        json.dump(doc, f)
    assert analyze_overflow(str(root)).culprit.key == "Torch.exp.0.forward"
    shutil.rmtree(os.path.join(rank, "dump_tensor_data"))  # no stats and no data: nothing to judge
    assert analyze_overflow(str(root)).culprit is None


# -- command line ----------------------------------------------------------------------------------
def _msprobe(*args):
    return subprocess.run([sys.executable, "-m", "msprobe.cli.main", *args], capture_output=True, text=True)


def test_cli_prints_culprit_and_writes_json(tmp_path):
    root = train(tmp_path / "dump", "L1", [100.0])
    res = _msprobe("overflow_check", "-i", str(root), "-o", str(tmp_path / "out"), "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "First anomaly: Torch.exp.0.forward" in res.stdout and "torch.exp(h * scale)" in res.stdout
    [name] = os.listdir(tmp_path / "out")
    assert name.startswith("anomaly_analyze_") and name.endswith(".json")
    doc = json.load(open(tmp_path / "out" / name))
    [entries] = doc.values()
    assert entries[0]["op_name"] == "Torch.exp.0.forward" and entries[0]["data_info"]["output"][0]["Max"] == "inf"


def test_cli_clean_dump(tmp_path):
    root = train(tmp_path / "dump", "L1", [0.1])
    res = _msprobe("overflow_check", "-i", str(root), "-o", str(tmp_path / "out"), "--no-progress")
    assert res.returncode == 0 and NO_ANOMALY in res.stdout


def test_cli_errors_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    res = _msprobe("overflow_check", "-i", str(tmp_path / "empty"))
    assert res.returncode == 1 and "no dump found" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad" / "step0" / "rank0"
    bad.mkdir(parents=True)
    (bad / "dump.json").write_text('{"task": "statistics", "data": {"a": ')
    res = _msprobe("overflow_check", "-i", str(tmp_path / "bad"))
    assert res.returncode == 1 and "not valid JSON" in res.stderr and "Traceback" not in res.stderr
    with pytest.raises(MsprobeError):
        analyze_overflow(str(tmp_path / "empty"))
    with pytest.raises(DumpFormatError):
        analyze_overflow(str(tmp_path / "bad"))


# -- two ranks -------------------------------------------------------------------------------------
WORKER = textwrap.dedent('''
    import datetime, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from msprobe.pytorch import PrecisionDebugger

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    debugger = PrecisionDebugger(dump_path=sys.argv[1], level="L1")
    for step in range(2):
        debugger.start()
        h = model(torch.randn(2, 4))
        if rank == 1 and step == 1:
            h = torch.exp(h * 1000.0)       # rank 1 alone overflows, in step 1
        else:
            h = torch.tanh(h)
        dist.all_reduce(h)                    # ... and all_reduce gives every rank the inf
        h.sum().backward()
        debugger.stop()
        debugger.step()
    dist.barrier()
    dist.destroy_process_group()
''')


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_all_reduce_traced_to_rank1(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    dump = tmp_path / "dump"
    procs = []
    port = _free_port()
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), str(dump)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert sorted(os.listdir(dump / "step1")) == ["rank0", "rank1"]
    # the premise: rank 0's all_reduce had finite input and inf output
    rank0 = json.load(open(dump / "step1" / "rank0" / "dump.json"))["data"]["Distributed.all_reduce.0.forward"]
    assert rank0["input_args"][0]["Max"] != "inf" and rank0["output"][0]["Max"] == "inf"

    result = analyze_overflow(str(dump))
    culprit = result.culprit
    assert (culprit.key, culprit.rank, culprit.step, culprit.label) == ("Torch.exp.0.forward", 1, 1, "rank_1")
    received = [a for a in result.anomalies if a.kind == "received"]
    assert [(a.rank, a.key, a.from_ranks) for a in received] == [(0, "Distributed.all_reduce.0.forward", [1])]
    assert all(a.kind != "origin" or a.rank == 1 for a in result.anomalies)
    assert list(result.by_label()) == ["rank_1", "rank_0"]

"""grad_probe for PyTorch on real training runs: what each level records (checked against the gradients
themselves), step/rank/param selection, config errors, and a 2-rank DDP run writing one dir per rank."""

import csv
import json
import os
import socket
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from msprobe.core.errors import ConfigError  # noqa: E402
from msprobe.core.grad_probe.config import grad_probe_config_from_dict, load_grad_probe_config  # noqa: E402
from msprobe.pytorch.grad_probe import GradientMonitor  # noqa: E402


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3))


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 6, generator=g), torch.randn(16, 3, generator=g)) for _ in range(n)]


def train(model, data, monitor=None, record=None):
    """SGD over `data`; `record` collects a copy of every gradient just before each optimizer step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data:
        nn.functional.mse_loss(model(x), y).backward()
        if record is not None:
            record.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    if monitor is not None:
        monitor.close()


def run(tmp_path, level, top=None, **block):
    cfg = {"task": "grad_probe", "dump_path": str(tmp_path / level), "grad_probe": {"grad_level": level, **block},
           **(top or {})}
    monitor = GradientMonitor(config=grad_probe_config_from_dict(cfg))
    model = make_model()
    monitor.monitor(model)
    grads = []
    train(model, batches(4), monitor, grads)
    return tmp_path / level / "rank0", grads


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("level", ["L0", "L1", "L2"])
def test_levels_record_the_gradients(tmp_path, level):
    rank_dir, grads = run(tmp_path, level, bounds=[-0.1, 0, 0.1])
    assert sorted(os.listdir(rank_dir)) == sorted(
        [f"grad_summary_{s}.csv" for s in range(4)] + ([f"step{s}" for s in range(4)] if level != "L0" else []))
    for step, expected in enumerate(grads):
        rows = read_csv(rank_dir / f"grad_summary_{step}.csv")
        assert [r["Param_name"] for r in rows] == ["0.weight", "0.bias", "2.weight", "2.bias"]
        for row in rows:
            g = expected[row["Param_name"]]
            assert float(row["Max"]) == pytest.approx(g.max().item(), rel=1e-6)
            assert float(row["Min"]) == pytest.approx(g.min().item(), rel=1e-6)
            assert float(row["Norm"]) == pytest.approx(g.norm().item(), rel=1e-5)
            assert json.loads(row["Shape"]) == list(g.shape)
            if level == "L0":
                assert row["MD5"] == f"{zlib.crc32(g.numpy().tobytes()) & 0xFFFFFFFF:08x}"
                continue
            assert "MD5" not in row
            bits = np.load(rank_dir / f"step{step}" / f"{row['Param_name']}.npy")
            assert bits.dtype == np.uint8 and bits.size == (g.numel() + 7) // 8  # 1 bit per element
            assert np.array_equal(np.unpackbits(bits, count=g.numel()).astype(bool), (g > 0).numpy().ravel())
            if level == "L2":
                flat = g.ravel()
                want = [(flat <= -0.1).float().mean(), ((flat > -0.1) & (flat <= 0)).float().mean(),
                        ((flat > 0) & (flat <= 0.1)).float().mean(), (flat > 0.1).float().mean(),
                        (flat == 0).float().mean()]
                got = [float(row[c]) for c in ("(-inf, -0.1]", "(-0.1, 0]", "(0, 0.1]", "(0.1, inf)", "=0")]
                assert got == pytest.approx([w.item() for w in want], abs=1e-6)


def test_step_rank_and_param_selection(tmp_path):
    rank_dir, _ = run(tmp_path, "L1", param_list=["2."], top={"step": [1, "3-5"]})
    assert sorted(os.listdir(rank_dir)) == ["grad_summary_1.csv", "grad_summary_3.csv", "step1", "step3"]
    assert [r["Param_name"] for r in read_csv(rank_dir / "grad_summary_3.csv")] == ["2.weight", "2.bias"]
    assert sorted(os.listdir(rank_dir / "step1")) == ["2.bias.npy", "2.weight.npy"]
    # rank [1] in a single process (rank 0): nothing is written
    other = run(tmp_path / "r", "L1", top={"rank": [1]})[0]
    assert not other.exists()


def test_only_optimizers_of_monitored_parameters_count_steps(tmp_path):
    """A second optimizer over another model does not advance the monitored model's step counter."""
    cfg = grad_probe_config_from_dict({"task": "grad_probe", "dump_path": str(tmp_path / "g")})
    monitor = GradientMonitor(config=cfg)
    model, other = make_model(), nn.Linear(2, 2)
    monitor.monitor(model)
    opt, opt_other = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(other.parameters(), lr=0.1)
    for x, y in batches(3):
        nn.functional.mse_loss(model(x), y).backward()
        other(torch.ones(1, 2)).sum().backward()
        opt_other.step()
        opt.step()
        opt.zero_grad()
    monitor.close()
    assert monitor.current_step == 3
    assert sorted(f for f in os.listdir(tmp_path / "g" / "rank0") if f.endswith(".csv")) == \
        [f"grad_summary_{s}.csv" for s in range(3)]


# -- config ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, field, fragment", [
    ({"grad_probe": {"grad_level": "L3"}}, "grad_probe.grad_level", "L0 | L1 | L2"),
    ({"grad_probe": {"bounds": [1, 0]}}, "grad_probe.bounds", "strictly increasing"),
    ({"grad_probe": {"bounds": []}}, "grad_probe.bounds", "non-empty"),
    ({"grad_probe": {"bounds": [0, True]}}, "grad_probe.bounds", "finite numbers"),
    ({"grad_probe": {"param_list": "fc"}}, "grad_probe.param_list", "list"),
    ({"grad_probe": {"grad_lvl": "L1"}}, "grad_probe.grad_lvl", "did you mean 'grad_level'"),
    ({"grad_probe": []}, "grad_probe", "an object"),
    ({"step": [-1]}, "step", "non-negative"),
    ({"dump_pth": "x"}, "dump_pth", "did you mean 'dump_path'"),
    ({"task": "statistics"}, "task", "grad_probe"),
])
def test_config_errors_name_field_value_and_allowed(raw, field, fragment):
    cfg = {"task": "grad_probe", **raw}
    with pytest.raises(ConfigError) as e:
        grad_probe_config_from_dict(cfg)
    assert e.value.field == field and fragment in str(e.value) and "\n" not in str(e.value)


def test_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "grad_probe", "dump_path": "out", "rank": [], "step": [0, 2],
                                "level": "L1", "statistics": {"scope": []},
                                "grad_probe": {"grad_level": "L2", "param_list": ["fc"], "bounds": [-2, 0, 2.5]}}))
    cfg = load_grad_probe_config(str(path))
    assert (cfg.dump_path, cfg.step, cfg.grad_level, cfg.param_list, cfg.bounds) == \
        ("out", [0, 2], "L2", ["fc"], [-2, 0, 2.5])
    assert (cfg.grad_level, cfg.bounds) == ("L2", [-2, 0, 2.5])
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="valid JSON"):
        GradientMonitor(str(path))
    with pytest.raises(ConfigError, match="existing config.json"):
        GradientMonitor(str(tmp_path / "missing.json"))


def test_param_list_matching_nothing_is_an_error(tmp_path):
    monitor = GradientMonitor(config=grad_probe_config_from_dict(
        {"task": "grad_probe", "dump_path": str(tmp_path), "grad_probe": {"param_list": ["decoder"]}}))
    with pytest.raises(ConfigError, match="grad_probe.param_list.*0.weight"):
        monitor.monitor(make_model())
    with pytest.raises(ConfigError, match="model"):
        monitor.monitor("not a model")


# -- two ranks -------------------------------------------------------------------------------------
WORKER = textwrap.dedent('''
    import datetime, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from msprobe.core.grad_probe.config import grad_probe_config_from_dict
    from msprobe.pytorch.grad_probe import GradientMonitor

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    monitor = GradientMonitor(config=grad_probe_config_from_dict(
        {"task": "grad_probe", "dump_path": sys.argv[1], "grad_probe": {"grad_level": "L1"}}))
    monitor.monitor(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        torch.manual_seed(100 * rank + step)             # each rank its own batch
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    monitor.close()
    dist.barrier()  # no rank tears gloo down while its peer is still in DDP's last all-reduce
    dist.destroy_process_group()
''')


def test_ddp_two_ranks_write_one_dir_each_with_reduced_gradients(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "out")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                                       WORLD_SIZE="2", OMP_NUM_THREADS="1")) for r in range(2)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert sorted(os.listdir(tmp_path / "out")) == ["rank0", "rank1"]
    for step in range(2):
        r0 = read_csv(tmp_path / "out" / "rank0" / f"grad_summary_{step}.csv")
        r1 = read_csv(tmp_path / "out" / "rank1" / f"grad_summary_{step}.csv")
        assert [r["Param_name"] for r in r0] == ["module.0.weight", "module.0.bias", "module.2.weight",
                                                 "module.2.bias"]
        # the optimizer sees DDP's averaged gradients: the same on both ranks although the batches differ
        assert [r["Norm"] for r in r0] == [r["Norm"] for r in r1]


@pytest.mark.parametrize("level", ["L0", "L1", "L2"])
def test_accelerator_path_matches_the_cpu_path(level):
    """The path used off the CPU (stats stacked, bits packed with torch, one uint8 buffer to the host) run
    on CPU tensors gives what the numpy path gives: same statistics, shares, checksums and bits."""
    from msprobe.pytorch.grad_probe.reduce import GradReducer
    torch.manual_seed(3)
    grads = [torch.randn(7, 5), torch.zeros(3), torch.randn(13) * 3, torch.empty(0), torch.randn(2, 2, 2)]
    grads[2][4] = 0.0
    host = GradReducer(level, [-1, 0, 1]).reduce(grads)()
    device = GradReducer(level, [-1, 0, 1], numpy_on_cpu=False).reduce(grads)()
    for a, b in zip(host.stats, device.stats):
        np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=1e-6)
    assert host.md5 == device.md5
    if level == "L2":
        np.testing.assert_allclose(np.asarray(host.dist, dtype=np.float64), np.asarray(device.dist, dtype=np.float64),
                                   rtol=1e-6)
    if level == "L0":
        assert host.bits is None and device.bits is None
    else:
        assert len(host.bits) == len(device.bits) == len(grads)
        for a, b, g in zip(host.bits, device.bits, grads):
            assert np.array_equal(a, b) and a.size == (g.numel() + 7) // 8


def test_precision_debugger_with_task_grad_probe_monitors_like_msprobe(tmp_path):
    """msProbe's interface: PrecisionDebugger(config with task grad_probe).monitor(model), then train."""
    from msprobe.pytorch import PrecisionDebugger

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "grad_probe", "dump_path": str(tmp_path / "out"), "step": [1],
                                "grad_probe": {"grad_level": "L1", "param_list": ["2."]}}))
    debugger = PrecisionDebugger(str(path))
    model = make_model()
    debugger.monitor(model)
    grads = []
    train(model, batches(3), None, grads)
    debugger.stop()
    rows = read_csv(tmp_path / "out" / "rank0" / "grad_summary_1.csv")
    assert [r["Param_name"] for r in rows] == ["2.weight", "2.bias"]
    assert float(rows[0]["Norm"]) == pytest.approx(grads[1]["2.weight"].norm().item(), rel=1e-5)
    assert sorted(os.listdir(tmp_path / "out" / "rank0")) == ["grad_summary_1.csv", "step1"]
    # the constructor's task/dump_path override the file, as for dumps
    other = PrecisionDebugger(task="grad_probe", dump_path=str(tmp_path / "other"))
    assert other.config.dump_path == str(tmp_path / "other")
    with pytest.raises(ConfigError, match="grad_probe.grad_level"):
        path.write_text(json.dumps({"task": "grad_probe", "grad_probe": {"grad_level": "L9"}}))
        PrecisionDebugger(str(path))

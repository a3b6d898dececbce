"""grad_probe for MindSpore (PyNative) on real training: what each level records, checked against the
gradients value_and_grad returned; selection; and grad_compare on runs perturbed at step 3."""

import csv
import json
import os
import zlib

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
from msprobe.mindspore.grad_probe import GradientMonitor  # noqa: E402  (also applies msprobe's numpy shim)
from mindspore import Tensor, nn  # noqa: E402

from msprobe.core.errors import ConfigError  # noqa: E402
from msprobe.core.grad_probe.compare import compare_grad_runs  # noqa: E402
from msprobe.core.grad_probe.config import grad_probe_config_from_dict  # noqa: E402

STEPS = 5


def train(out, level="L1", perturb_at=None, top=None, **block):
    """SGD on fixed batches under a GradientMonitor; returns the gradients of every step (numpy)."""
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(6, 8), nn.Tanh(), nn.Dense(8, 3))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    cfg = {"task": "grad_probe", "dump_path": str(out), "grad_probe": {"grad_level": level, **block}, **(top or {})}
    monitor = GradientMonitor(config=grad_probe_config_from_dict(cfg))
    monitor.monitor(opt)
    rng = np.random.default_rng(1)
    data = [(rng.standard_normal((16, 6)).astype(np.float32), rng.standard_normal((16, 3)).astype(np.float32))
            for _ in range(STEPS)]
    seen = []
    for step, (x, y) in enumerate(data):
        if step == perturb_at:
            x = np.random.default_rng(99).standard_normal((16, 6)).astype(np.float32)
        _, grads = grad_fn(Tensor(x), Tensor(y))
        seen.append({p.name: g.asnumpy() for p, g in zip(opt.parameters, grads)})
        opt(grads)
    monitor.close()
    return seen


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("level", ["L0", "L1", "L2"])
def test_levels_record_the_gradients(tmp_path, level):
    grads = train(tmp_path / "out", level, bounds=[-0.1, 0, 0.1])
    rank_dir = tmp_path / "out" / "rank0"
    for step, expected in enumerate(grads):
        rows = read_csv(rank_dir / f"grad_summary_{step}.csv")
        assert [r["Param_name"] for r in rows] == ["0.weight", "0.bias", "2.weight", "2.bias"]
        for row in rows:
            g = expected[row["Param_name"]]
            assert float(row["Max"]) == pytest.approx(g.max(), rel=1e-6)
            assert float(row["Min"]) == pytest.approx(g.min(), rel=1e-6)
            assert float(row["Norm"]) == pytest.approx(np.linalg.norm(g), rel=1e-5)
            assert json.loads(row["Shape"]) == list(g.shape)
            if level == "L0":
                assert row["MD5"] == f"{zlib.crc32(g.tobytes()) & 0xFFFFFFFF:08x}"
                assert not (rank_dir / f"step{step}").exists()
                continue
            bits = np.load(rank_dir / f"step{step}" / f"{row['Param_name']}.npy")
            assert np.array_equal(np.unpackbits(bits, count=g.size).astype(bool), g.ravel() > 0)
            if level == "L2":
                f = g.ravel()
                want = [np.mean(f <= -0.1), np.mean((f > -0.1) & (f <= 0)), np.mean((f > 0) & (f <= 0.1)),
                        np.mean(f > 0.1), np.mean(f == 0)]
                got = [float(row[c]) for c in ("(-inf, -0.1]", "(-0.1, 0]", "(0, 0.1]", "(0.1, inf)", "=0")]
                assert got == pytest.approx(want, abs=1e-6)


def test_selection(tmp_path):
    train(tmp_path / "out", "L1", top={"step": ["1-2"]}, param_list=["2.weight"])
    rank_dir = tmp_path / "out" / "rank0"
    assert sorted(os.listdir(rank_dir)) == ["grad_summary_1.csv", "grad_summary_2.csv", "step1", "step2"]
    assert [r["Param_name"] for r in read_csv(rank_dir / "grad_summary_1.csv")] == ["2.weight"]
    monitor = GradientMonitor(config=grad_probe_config_from_dict(
        {"task": "grad_probe", "dump_path": str(tmp_path), "grad_probe": {"param_list": ["decoder"]}}))
    net = nn.Dense(2, 2)
    with pytest.raises(ConfigError, match="grad_probe.param_list"):
        monitor.monitor(nn.SGD(net.trainable_params()))
    with pytest.raises(ConfigError, match="mindspore.nn.Optimizer"):
        monitor.monitor(net)


def test_grad_compare_names_step3(tmp_path):
    train(tmp_path / "a")
    train(tmp_path / "b", perturb_at=3)
    train(tmp_path / "c")
    [diverged] = compare_grad_runs(str(tmp_path / "a"), str(tmp_path / "b"))
    assert (diverged.first_divergent_step, diverged.first_different_step) == (3, 3)
    [same] = compare_grad_runs(str(tmp_path / "a"), str(tmp_path / "c"))
    assert same.first_divergent_step is None and same.first_different_step is None


def test_precision_debugger_with_task_grad_probe_monitors_the_optimizer(tmp_path):
    """msProbe's MindSpore interface: PrecisionDebugger(config with task grad_probe).monitor(optimizer)."""
    from msprobe.mindspore import PrecisionDebugger

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "grad_probe", "dump_path": str(tmp_path / "out"), "step": [0],
                                "grad_probe": {"grad_level": "L0"}}))
    debugger = PrecisionDebugger(str(path))
    ms.set_seed(0)
    net = nn.SequentialCell(nn.Dense(6, 8), nn.Tanh(), nn.Dense(8, 3))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    debugger.monitor(opt)
    grad_fn = ms.value_and_grad(lambda x, y: nn.MSELoss()(net(x), y), None, opt.parameters)
    rng = np.random.default_rng(1)
    seen = []
    for _ in range(2):
        _, grads = grad_fn(Tensor(rng.standard_normal((4, 6)).astype(np.float32)),
                           Tensor(rng.standard_normal((4, 3)).astype(np.float32)))
        seen.append(grads[0].asnumpy())
        opt(grads)
    debugger.stop()
    assert os.listdir(tmp_path / "out" / "rank0") == ["grad_summary_0.csv"]
    row = read_csv(tmp_path / "out" / "rank0" / "grad_summary_0.csv")[0]
    assert row["Param_name"] == "0.weight"
    assert float(row["Norm"]) == pytest.approx(np.linalg.norm(seen[0]), rel=1e-5)

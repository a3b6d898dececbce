"""task overflow_check on MindSpore (PyNative, real mint network trained with value_and_grad): only calls
whose outputs overflow are written, with their inputs and tensor files; overflow_nums bounds how many;
`msprobe overflow_check` names the op. The network overflows in one known op: mint.exp of h * 100."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
from mindspore import mint, nn  # noqa: E402

from msprobe.core.dump.reader import DumpReader, find_rank_dirs  # noqa: E402
from msprobe.core.errors import ConfigError  # noqa: E402
from msprobe.mindspore import PrecisionDebugger, seed_all  # noqa: E402


class Blowup(nn.Cell):
    """fc1 -> relu -> exp(h * scale) (inf for h > ~0.89 at scale 100) -> fc2."""

    def __init__(self, scale):
        super().__init__()
        self.fc1 = mint.nn.Linear(8, 16)
        self.fc2 = mint.nn.Linear(16, 4)
        self.scale = scale

    def construct(self, x):
        h = mint.nn.functional.relu(self.fc1(x))
        h = mint.exp(h * self.scale)
        return self.fc2(h)


class Half(nn.Cell):
    """float16 multiply beyond 65504 saturates to inf: the mul is the op that overflows."""

    def construct(self, x):
        return mint.add(mint.mul(x, 1000.0), 1.0)


def run(tmp_path, overflow_nums=1, level="L1", scale=100.0, steps=1, extra=None):
    seed_all(0)
    net = Blowup(scale)
    cfg = {"task": "overflow_check", "level": level, "dump_path": str(tmp_path / "dump"),
           "overflow_check": {"overflow_nums": overflow_nums}}
    cfg.update(extra or {})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    debugger = PrecisionDebugger(config_path=str(path))
    x = ms.Tensor(np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32) * 3)
    grad_fn = ms.value_and_grad(lambda xb: mint.sum(net(xb)), None, net.trainable_params())
    for _ in range(steps):
        debugger.start(net)
        grad_fn(x)
        debugger.stop()
        debugger.step()
    return tmp_path / "dump"


def only_reader(root, step=0):
    dirs = [d for d in find_rank_dirs(str(root)) if d.step == step]
    assert len(dirs) == 1, dirs
    return DumpReader(dirs[0].path), dirs[0].path


def test_first_overflow_only_with_inputs_and_tensor_files(tmp_path):
    root = run(tmp_path, overflow_nums=1)
    reader, rank_dir = only_reader(root)
    assert list(reader.data) == ["Mint.exp.0.forward"]
    rec = reader.data["Mint.exp.0.forward"]
    (inp,), (out,) = rec["input_args"], rec["output"]
    assert out["Max"] == "inf" or out["Max"] == float("inf")
    # the input that caused it is on disk: finite, and exp of it overflows float32
    x = np.load(os.path.join(rank_dir, "dump_tensor_data", inp["data_name"]))
    assert np.isfinite(x).all() and x.max() > 88.8
    assert float(inp["Max"]) == pytest.approx(float(x.max()), rel=1e-6)
    y = np.load(os.path.join(rank_dir, "dump_tensor_data", out["data_name"]))
    assert np.isinf(y).any()
    np.testing.assert_array_equal(np.isinf(y), x > 88.8)
    # only the kept record's tensors were written
    assert sorted(os.listdir(os.path.join(rank_dir, "dump_tensor_data"))) == sorted(
        [inp["data_name"], out["data_name"]])


def test_cli_names_the_op(tmp_path):
    root = run(tmp_path, overflow_nums=1)
    out = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "overflow_check", "-i", str(root),
                          "-o", str(tmp_path / "report")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Mint.exp.0.forward" in out.stdout


def test_unlimited_keeps_every_overflow_forward_and_backward(tmp_path):
    root = run(tmp_path, overflow_nums=-1, level="mix")
    reader, _ = only_reader(root)
    keys = list(reader.data)
    # exp overflows; everything after it sees inf/nan: fc2 and the sum, then every gradient (nan) on the way
    # back; the forward calls before exp (fc1, relu, the mul) stay finite and are not recorded
    assert keys[0] == "Mint.exp.0.forward", keys
    assert "Cell.fc2.Linear.forward.0" in keys and "Mint.sum.0.forward" in keys
    assert not any(k.endswith("forward") or ".forward." in k for k in keys[keys.index("Mint.sum.0.forward") + 1:])
    assert not any(k.startswith(("Cell.fc1.Linear.forward", "MintFunctional.relu.0.forward",
                                 "Tensor.__mul__.0.forward")) for k in keys), keys
    assert "Mint.exp.0.backward" in keys and "Cell.fc1.Linear.parameters_grad.0" in keys, keys
    for key in keys:
        rec = reader.data[key]
        outs = [v[0] for v in rec.values()] if "parameters_grad" in key else rec["output"]
        assert any(not np.isfinite(float(r["Max"])) or not np.isfinite(float(r["Min"]))
                   for r in outs if isinstance(r, dict) and "Max" in r), key


def test_overflow_nums_counts_over_steps(tmp_path):
    root = run(tmp_path, overflow_nums=2, steps=3)
    counts = {d.step: len(DumpReader(d.path).data) for d in find_rank_dirs(str(root))}
    assert sum(counts.values()) == 2, counts
    assert counts[0] == 2 and 2 not in counts


def test_no_overflow_writes_nothing(tmp_path):
    root = run(tmp_path, overflow_nums=-1, level="mix", scale=0.01)
    assert not os.path.exists(root) or find_rank_dirs(str(root)) == []


def test_float16_saturation_is_an_overflow(tmp_path):
    net = Half()
    cfg = {"task": "overflow_check", "level": "L1", "dump_path": str(tmp_path / "dump"),
           "overflow_check": {"overflow_nums": 1}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    debugger = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    x = ms.Tensor(np.array([1.0, 70.0, -3.0], np.float16))
    debugger.start(net)
    net(x)
    debugger.stop()
    debugger.step()
    reader, _ = only_reader(tmp_path / "dump")
    assert list(reader.data) == ["Mint.mul.0.forward"]
    assert reader.data["Mint.mul.0.forward"]["output"][0]["dtype"] == "Float16"


def test_graph_mode_is_a_clear_config_error(tmp_path):
    cfg = {"task": "overflow_check", "level": "L0", "dump_path": str(tmp_path / "dump")}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    debugger = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(ConfigError, match="overflow_check"):
            debugger.start(Blowup(1.0))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_input_only_data_mode_still_decides_on_the_outputs(tmp_path):
    root = run(tmp_path, overflow_nums=1, extra={"overflow_check": {"overflow_nums": 1, "data_mode": ["input"]}})
    reader, rank_dir = only_reader(root)
    assert list(reader.data) == ["Mint.exp.0.forward"]
    rec = reader.data["Mint.exp.0.forward"]
    assert rec["output"] == [] and rec["input_args"][0]["data_name"]
    assert os.listdir(os.path.join(rank_dir, "dump_tensor_data")) == [rec["input_args"][0]["data_name"]]

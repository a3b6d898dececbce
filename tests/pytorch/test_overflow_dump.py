"""task overflow_check: only calls whose outputs overflow are written, with their inputs and tensor files;
overflow_nums bounds how many. The model overflows in one known op (torch.exp of a large value)."""

import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from msprobe.core.dump.reader import DumpReader, find_rank_dirs
from msprobe.core.overflow import analyze_overflow
from msprobe.pytorch import PrecisionDebugger


class Blowup(nn.Module):
    """fc1 -> relu -> exp(h * 100) (inf for h > ~0.89) -> fc2."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        h = torch.exp(h * 100.0)
        return self.fc2(h)


def run(tmp_path, overflow_nums, level="L1", steps=1, x=None, data_mode=None):
    torch.manual_seed(0)
    model = Blowup()
    cfg = {"task": "overflow_check", "level": level, "dump_path": str(tmp_path / "dump"),
           "overflow_check": {"overflow_nums": overflow_nums}}
    if data_mode:
        cfg["overflow_check"]["data_mode"] = data_mode
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    debugger = PrecisionDebugger(config_path=str(path))
    x = torch.randn(5, 8) * 3 if x is None else x
    for _ in range(steps):
        debugger.start(model)
        loss = model(x).sum()
        loss.backward()
        debugger.stop()
        debugger.step()
    debugger.close()
    return tmp_path / "dump", model, x


def only_reader(root, step=0):
    dirs = [d for d in find_rank_dirs(str(root)) if d.step == step]
    assert len(dirs) == 1, dirs
    return DumpReader(dirs[0].path), dirs[0].path


def test_first_overflow_only_with_inputs_and_tensor_files(tmp_path):
    root, model, x = run(tmp_path, overflow_nums=1)
    reader, rank_dir = only_reader(root)
    assert reader.task == "overflow_check" and reader.level == "L1"
    keys = list(reader.keys())
    assert keys == ["Torch.exp.0.forward"]  # nothing before it, nothing after it
    rec = reader[keys[0]]
    (inp,), (out,) = rec["input_args"], rec["output"]
    assert out["Max"] == "inf" and isinstance(inp["Max"], float) and np.isfinite(inp["Max"])
    # the tensors are on disk: the input that caused it, and the overflowing output
    want_in = F.relu(model.fc1(x)).detach() * 100.0
    got_in = reader.load_tensor(inp).array
    np.testing.assert_allclose(got_in, want_in.numpy(), rtol=1e-6)
    got_out = reader.load_tensor(out).array
    assert np.isinf(got_out).any() and np.array_equal(np.isinf(got_out), np.isinf(torch.exp(want_in).numpy()))
    assert sorted(os.listdir(os.path.join(rank_dir, "dump_tensor_data"))) == [
        "Torch.exp.0.forward.input.0.npy", "Torch.exp.0.forward.output.0.npy"]
    # the construct/stack entries of the record are there for the overflow analysis
    stack = json.load(open(os.path.join(rank_dir, "stack.json")))
    assert any("Torch.exp.0.forward" in keys and any("torch.exp(h * 100.0)" in line for line in lines)
               for keys, lines in stack.values())
    analysis = analyze_overflow(str(root))
    assert analysis.culprit is not None and analysis.culprit.key == "Torch.exp.0.forward"


def test_unlimited_records_what_follows_forward_and_backward(tmp_path):
    root, _, _ = run(tmp_path, overflow_nums=-1)
    reader, _ = only_reader(root)
    keys = list(reader.keys())
    # the exp, then the linear fed with inf, then the backward calls whose gradients are inf/nan
    assert keys[:2] == ["Torch.exp.0.forward", "Functional.linear.1.forward"]
    assert "Functional.linear.0.forward" not in keys and "Tensor.__mul__.0.forward" not in keys
    backward = [k for k in keys if k.endswith(".backward")]
    assert "Torch.exp.0.backward" in backward
    for key in keys:
        rec = reader[key]
        outs = rec["output"]
        assert any(o is not None and ("inf" in (o["Max"], o["Min"]) or "nan" in (o["Max"], o["Min"])
                                      or "-inf" in (o["Max"], o["Min"])) for o in outs), key


def test_overflow_nums_counts_across_steps(tmp_path):
    root, _, _ = run(tmp_path, overflow_nums=3, steps=2)
    reader, _ = only_reader(root, 0)
    assert len(list(reader.keys())) == 3
    assert not [d for d in find_rank_dirs(str(root)) if d.step == 1]  # budget spent in step 0


def test_no_overflow_writes_nothing(tmp_path):
    # relu(bias) <= 0.35: exp(35) is large but finite, and so is everything downstream
    root, _, _ = run(tmp_path, overflow_nums=-1, x=torch.zeros(5, 8))
    assert not os.path.exists(root / "step0")  # nothing overflowed: no record, no directory


def test_mix_level_records_the_module_too(tmp_path):
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Blowup()

        def forward(self, x):
            return self.inner(x)
    torch.manual_seed(0)
    model = Outer()
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "overflow_check", "level": "mix", "dump_path": str(tmp_path / "d"),
                               "overflow_check": {"overflow_nums": -1, "data_mode": ["forward"]}}))
    debugger = PrecisionDebugger(config_path=str(cfg))
    debugger.start(model)
    model(torch.randn(5, 8) * 3)
    debugger.stop()
    debugger.step()
    reader, rank_dir = only_reader(tmp_path / "d")
    keys = list(reader.keys())
    assert keys[0] == "Torch.exp.0.forward"
    assert "Module.inner.Blowup.forward.0" in keys and "Module.inner.fc1.Linear.forward.0" not in keys
    assert "Module.inner.fc2.Linear.forward.0" in keys
    mod = reader["Module.inner.fc2.Linear.forward.0"]
    assert set(mod["parameters"]) == {"weight", "bias"} and mod["parameters"]["weight"]["data_name"]
    construct = json.load(open(os.path.join(rank_dir, "construct.json")))
    assert construct["Torch.exp.0.forward"] == "Module.inner.Blowup.forward.0"
    assert not any(k.endswith("backward") for k in keys)


def test_half_precision_saturation_counts(tmp_path):
    """fp16 values at finfo.max (a saturating device's overflow) are overflows, like inf."""
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "overflow_check", "level": "L1", "dump_path": str(tmp_path / "d"),
                               "overflow_check": {"overflow_nums": -1}}))
    debugger = PrecisionDebugger(config_path=str(cfg))
    a = torch.tensor([1.0, 300.0], dtype=torch.float16)
    debugger.start()
    b = torch.add(a, 1.0)                 # fine
    c = torch.clamp(b * 1000, max=65504)  # mul: inf; clamp: 65504 == finfo(float16).max
    torch.clamp(b, max=65504)             # fine
    debugger.stop()
    debugger.step()
    reader, _ = only_reader(tmp_path / "d")
    assert list(reader.keys()) == ["Tensor.__mul__.0.forward", "Torch.clamp.0.forward"]
    assert reader["Torch.clamp.0.forward"]["output"][0]["Max"] == 65504.0
    assert c.max().item() == 65504.0


def test_bad_overflow_nums_is_one_line_error(tmp_path):
    from msprobe.core.errors import ConfigError
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "overflow_check", "dump_path": str(tmp_path / "d"),
                               "overflow_check": {"overflow_nums": 0}}))
    with pytest.raises(ConfigError, match="overflow_nums"):
        PrecisionDebugger(config_path=str(cfg))


def test_l2_overflow_records_the_aten_op(tmp_path):
    root, model, x = run(tmp_path, overflow_nums=1, level="L2")
    reader, rank_dir = only_reader(root)
    assert list(reader.keys()) == ["Aten.exp.default.0.forward"]
    rec = reader["Aten.exp.default.0.forward"]
    assert rec["output"][0]["Max"] == "inf" and rec["input_args"][0]["data_name"]
    assert reader.construct["Aten.exp.default.0.forward"] == "Torch.exp.0.forward"

"""level L2: aten operators (below autograd) recorded as `Aten.{op}.{overload}.{n}.forward`, forward and the
aten ops autograd runs in backward, with the issuing API as parent in construct.json."""

import json
import os

import numpy as np
import torch
from torch import nn

from msprobe.core.dump.reader import DumpReader, find_rank_dirs
from msprobe.pytorch import PrecisionDebugger


def run(tmp_path, task="statistics", block=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    x = torch.randn(5, 4)
    cfg = {"task": task, "level": "L2", "dump_path": str(tmp_path / "dump")}
    if block:
        cfg[task] = block
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    debugger = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    debugger.start(model)
    y = model(x)
    y.sum().backward()
    debugger.stop()
    debugger.step()
    (rd,) = find_rank_dirs(str(tmp_path / "dump"))
    return DumpReader(rd.path), model, x, y


def close(rec, t):
    t = t.detach()
    assert rec["shape"] == list(t.shape) and rec["dtype"] == str(t.dtype)
    assert rec["Max"] == t.max().item() and rec["Min"] == t.min().item()
    assert abs(rec["Norm"] - t.norm().item()) <= 1e-5 * max(1.0, t.norm().item())


def test_forward_and_backward_aten_ops(tmp_path):
    r, model, x, y = run(tmp_path)
    keys = list(r.keys())
    assert r.level == "L2"
    assert keys.index("Aten.addmm.default.0.forward") < keys.index("Aten.relu.default.0.forward") \
        < keys.index("Aten.threshold_backward.default.0.forward")
    assert all(k.startswith("Aten.") and k.endswith(".forward") for k in keys)
    lin = model[0]
    addmm = r["Aten.addmm.default.0.forward"]
    close(addmm["input_args"][0], lin.bias)
    close(addmm["input_args"][1], x)
    close(addmm["output"][0], lin(x))
    close(r["Aten.relu.default.0.forward"]["output"][0], y)
    # backward: relu's gradient mask, then the weight gradient from an mm
    close(r["Aten.threshold_backward.default.0.forward"]["output"][0], (lin(x) > 0).float())
    weight_grads = [r[k]["output"][0] for k in keys if k.startswith("Aten.mm.default.")
                    and r[k]["output"][0]["shape"] in ([3, 4], [4, 3])]
    assert weight_grads
    close(weight_grads[0], lin.weight.grad if weight_grads[0]["shape"] == [3, 4] else lin.weight.grad.t())
    construct = r.construct
    assert construct["Aten.addmm.default.0.forward"] == "Functional.linear.0.forward"
    assert construct["Aten.relu.default.0.forward"] == "Functional.relu.0.forward"
    assert construct["Aten.threshold_backward.default.0.forward"] is None  # run by autograd
    assert r.stack["Aten.addmm.default.0.forward"]


def test_tensor_task_and_list(tmp_path):
    r, model, x, _ = run(tmp_path, task="tensor", block={"list": ["addmm", "threshold_backward"]})
    assert list(r.keys()) == ["Aten.addmm.default.0.forward", "Aten.threshold_backward.default.0.forward"]
    out = r["Aten.addmm.default.0.forward"]["output"][0]
    np.testing.assert_allclose(r.load_tensor(out).array, model[0](x).detach().numpy(), rtol=1e-6)
    assert sorted(os.listdir(os.path.join(r.rank_dir, "dump_tensor_data")))[0].startswith("Aten.addmm.default.0.")


def test_in_place_aten_op_inputs_before_the_call(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"task": "statistics", "level": "L2",
                                                 "dump_path": str(tmp_path / "d")}))
    debugger = PrecisionDebugger(config_path=str(tmp_path / "c.json"))
    a = torch.tensor([-1.0, 2.0, -3.0])
    debugger.start()
    a.relu_()
    debugger.stop()
    debugger.step()
    (rd,) = find_rank_dirs(str(tmp_path / "d"))
    rec = DumpReader(rd.path)["Aten.relu_.default.0.forward"]
    assert rec["input_args"][0]["Min"] == -3.0 and rec["output"][0]["Min"] == 0.0

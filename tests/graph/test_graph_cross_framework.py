"""MindSpore target against a PyTorch golden: the same MLP and weights, dumped at level mix by our two
dumpers; the graph pairs Cell with Module and mint/primitive APIs with their torch counterparts."""

import os

import numpy as np
import torch
import torch.nn.functional as F

from graph_db import read_graph_db
from msprobe.core.graph.build import visualize
from private_modules import load_private

MS_MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mindspore", "models.py")


def load_ms_models():
    """tests/mindspore/models.py under its own name (tests/pytorch has a `models` module too)."""
    return load_private("graph_ms_models", MS_MODELS)


class TorchMLP(torch.nn.Module):
    """tests/mindspore/models.py MintMLP in PyTorch."""

    def __init__(self, fc2_name="fc2"):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2_name = fc2_name
        setattr(self, fc2_name, torch.nn.Linear(32, 32))
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        h = torch.tanh(getattr(self, self.fc2_name)(h)) + h
        return self.head(h)


def dump_pair(tmp_path, fc2_name="fc2"):
    """The MindSpore MLP and its PyTorch twin (second layer named `fc2_name`), one training step each at mix."""
    ms_models = load_ms_models()
    from msprobe.mindspore import PrecisionDebugger as MsDebugger
    from msprobe.pytorch import PrecisionDebugger as PtDebugger

    ms_net = ms_models.build("mlp")
    pt_net = TorchMLP(fc2_name)
    weights = {n: p.asnumpy() for n, p in ms_net.parameters_and_names()}
    with torch.no_grad():
        for name, p in pt_net.named_parameters():
            p.copy_(torch.from_numpy(weights[name.replace(fc2_name + ".", "fc2.")]))
    x, y = ms_models.make_data("mlp")
    dbg = MsDebugger(dump_path=str(tmp_path / "ms"), level="mix")
    ms_models.train(ms_net, x, y, steps=1, debugger=dbg)
    dbg.close()
    dbg = PtDebugger(dump_path=str(tmp_path / "pt"), level="mix")
    opt = torch.optim.SGD(pt_net.parameters(), lr=0.05)
    dbg.start(pt_net)
    opt.zero_grad()
    torch.mean((pt_net(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).backward()
    opt.step()
    dbg.stop()
    dbg.step()
    dbg.close()


def test_mindspore_target_against_pytorch_golden(tmp_path):
    dump_pair(tmp_path)
    out = visualize(str(tmp_path / "ms" / "step0"), str(tmp_path / "out"), golden_path=str(tmp_path / "pt" / "step0"),
                    progress=False)
    (g,) = read_graph_db(out.db_path)["graphs"]
    match = dict(zip(g["names"], g["match"]))
    verdict = dict(zip(g["names"], g["verdict"]))
    assert out.document["graphs"][0]["framework"] == "mindspore"
    assert out.document["graphs"][0]["golden_framework"] == "pytorch"
    for layer in ("fc1", "fc2", "head"):
        for direction in ("forward", "backward"):
            cell = f"Cell.{layer}.Linear.{direction}.0"
            assert match[cell] == f"Module.{layer}.Linear.{direction}.0"
            assert verdict[cell] == "pass", cell
    for i in range(3):  # the dense primitive inside each Linear pairs with torch's linear
        assert match[f"Primitive.dense.Dense.{i}.forward"] == f"Functional.linear.{i}.forward"
        assert verdict[f"Primitive.dense.Dense.{i}.forward"] == "pass"
    assert match["Mint.tanh.0.forward"] == "Torch.tanh.0.forward"
    assert g["names"][g["parent"][g["names"].index("Primitive.dense.Dense.1.forward")]] == "Cell.fc2.Linear.forward.0"
    assert np.isclose(
        next(t["NPU max"] for t in g["tensors"] if t["NPU Name"] == "Cell.fc1.Linear.forward.0.output.0"),
        next(t["Bench max"] for t in g["tensors"] if t["NPU Name"] == "Cell.fc1.Linear.forward.0.output.0"),
        rtol=1e-5)


def test_renamed_child_of_the_root_pairs_through_toplayer(tmp_path):
    """seed 003's layer_mapping.yaml: `TopLayer` maps the root model's own children (MindSpore fc2 = PyTorch proj)."""
    dump_pair(tmp_path, fc2_name="proj")
    mapping = tmp_path / "layer_mapping.yaml"
    mapping.write_text("TopLayer:\n  fc2: proj\n")
    runs = {}
    for name, lm in (("without", None), ("with", str(mapping))):
        out = visualize(str(tmp_path / "ms" / "step0"), str(tmp_path / name), golden_path=str(tmp_path / "pt" / "step0"),
                        layer_mapping=lm, progress=False)
        (g,) = read_graph_db(out.db_path)["graphs"]
        runs[name] = (dict(zip(g["names"], g["match"])), dict(zip(g["names"], g["verdict"])))
    match, verdict = runs["with"]
    for direction in ("forward", "backward"):
        assert match[f"Cell.fc2.Linear.{direction}.0"] == f"Module.proj.Linear.{direction}.0"
        assert verdict[f"Cell.fc2.Linear.{direction}.0"] == "pass"
        assert not runs["without"][0].get(f"Cell.fc2.Linear.{direction}.0")  # unmatched without the mapping

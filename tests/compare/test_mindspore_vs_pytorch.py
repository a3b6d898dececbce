"""Cross-framework compare of our own dumps: a MindSpore network (dumped by msprobe.mindspore) against
the same network in PyTorch with the same weights and data (dumped by msprobe.pytorch), at mix level:
Cells pair with Modules, mint APIs with torch APIs, and nothing is an error."""

import os

import pytest

from private_modules import load_private

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
torch = pytest.importorskip("torch")

from msprobe.core.compare import compare_dumps  # noqa: E402


mlp_twins = load_private("msprobe_test_mlp_twins", os.path.join(os.path.dirname(__file__), "mlp_twins.py"))


def test_mindspore_dump_against_pytorch_dump_of_the_same_network(tmp_path):
    from msprobe.mindspore import PrecisionDebugger as MsDebugger
    from msprobe.pytorch import PrecisionDebugger as PtDebugger

    ms_net, pt_net, models = mlp_twins.twins()
    x, y = models.make_data("mlp")

    ms_dbg = MsDebugger(dump_path=str(tmp_path / "ms"), level="mix")
    models.train(ms_net, x, y, steps=1, debugger=ms_dbg)
    ms_dbg.close()

    pt_dbg = PtDebugger(dump_path=str(tmp_path / "pt"), level="mix")
    opt = torch.optim.SGD(pt_net.parameters(), lr=0.05)
    pt_dbg.start(pt_net)
    loss = torch.mean((pt_net(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2)
    loss.backward()
    opt.step()
    pt_dbg.stop()
    pt_dbg.step()
    pt_dbg.close()

    (res,) = compare_dumps(str(tmp_path / "ms"), str(tmp_path / "pt"), progress=False)
    assert (res.target_framework, res.golden_framework) == ("mindspore", "pytorch")
    tab = res.table
    pairs = dict(zip(tab["NPU Name"], tab["Bench Name"]))
    for ms_name, pt_name in pairs.items():
        if ms_name.startswith("Cell.") and ".forward." in ms_name:
            assert pt_name == ms_name.replace("Cell.", "Module.", 1), ms_name
    assert pairs["Cell.fc2.Linear.forward.0.output.0"] == "Module.fc2.Linear.forward.0.output.0"
    assert any(n.startswith("Mint.tanh.0.forward") and b.startswith("Torch.tanh.0.forward") for n, b in pairs.items())
    assert pairs["Cell.head.Linear.parameters_grad.0.weight"] == "Module.head.Linear.parameters_grad.0.weight"
    matched = tab[tab["Bench Name"] != "N/A"]
    # unpaired: only what one framework records and the other does not (MindSpore's jitted optimizer
    # step; `x ** 2`, which torch dispatches to a method that is not captured)
    unpaired = tab[tab["Bench Name"] == "N/A"]["NPU Name"]
    assert unpaired.str.startswith(("Jit.", "Tensor.__pow__.")).all(), unpaired.tolist()
    assert len(matched) >= 60
    # same weights and data: statistics agree to float32 rounding, so no row is an error
    assert not (matched["Result"] == "error").any(), matched[matched["Result"] == "error"][["NPU Name", "Err_message"]]
    norm = matched["NormRelativeErr"].map(lambda v: float(v[:-1]) / 100 if v.endswith("%") else float(v))
    assert norm.max() < 1e-4

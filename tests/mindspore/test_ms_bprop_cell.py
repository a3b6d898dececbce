"""A Cell with a custom bprop (MindSpore takes no forward hook on it and runs its construct without
recording a gradient): it keeps its forward record and its place in construct.json, its bprop's ops are
not recorded as forward calls, and its bprop is its backward record (dout in, the gradients out)."""

import glob
import json

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
from mindspore import nn  # noqa: E402


class GradScale(nn.Cell):
    def construct(self, x):
        return x * 1.0

    def bprop(self, x, out, dout):
        return (dout * 3.0,)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = nn.Dense(4, 4)
        self.scale = GradScale()
        self.b = nn.Dense(4, 2)

    def construct(self, x):
        return self.b(self.scale(self.a(x)))


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_custom_bprop_cell_keeps_its_records(tmp_path, level):
    from msprobe.mindspore import PrecisionDebugger
    ms.set_seed(1)
    net = Net()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    grad_fn = ms.value_and_grad(lambda x: net(x).sum(), None, opt.parameters)
    x = ms.Tensor(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    for _ in range(2):
        debugger.start(net)
        _, grads = grad_fn(x)
        opt(grads)
        debugger.stop()
        debugger.step()
    debugger.close()
    rank = glob.glob(str(tmp_path / "step1" / "*"))[0]
    data = json.load(open(f"{rank}/dump.json"))["data"]
    construct = json.load(open(f"{rank}/construct.json"))
    fwd, bwd = data["Cell.scale.GradScale.forward.0"], data["Cell.scale.GradScale.backward.0"]
    assert fwd["output"][0]["Norm"] == pytest.approx(fwd["input_args"][0]["Norm"], rel=1e-6)
    # the bprop is the backward record: three times the incoming gradient
    assert bwd["output"][0]["Norm"] == pytest.approx(3 * bwd["input"][0]["Norm"], rel=1e-5)
    # its place: a sibling of a and b, not the parent of what follows it
    assert construct["Cell.scale.GradScale.forward.0"] is None
    assert construct["Cell.b.Dense.forward.0"] is None
    assert construct["Cell.b.Dense.backward.0"] is None
    if level == "mix":
        assert construct["Tensor.__mul__.0.forward"] == "Cell.scale.GradScale.forward.0"
        # the bprop's `dout * 3.0` is not a forward call
        assert [k for k in data if k.startswith("Tensor.__mul__")] == ["Tensor.__mul__.0.forward"]

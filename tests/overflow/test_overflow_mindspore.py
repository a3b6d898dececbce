"""msprobe overflow_check on a MindSpore (PyNative) dump made by msprobe.mindspore.PrecisionDebugger."""

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
from msprobe.mindspore import PrecisionDebugger  # noqa: E402  (also applies msprobe's numpy shim)
from mindspore import mint, nn  # noqa: E402

from msprobe.core.overflow import analyze_overflow  # noqa: E402


class ExpNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 16)
        self.head = nn.Dense(16, 2)

    def construct(self, x, scale):
        h = mint.nn.functional.relu(self.fc(x))
        return self.head(mint.exp(h * scale))


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_mint_exp_overflow_named_first(tmp_path, level):
    """Step 0 finite, step 1 exp overflows: Mint.exp of step 1 is the culprit, with the user's line."""
    ms.set_seed(0)
    net = ExpNet()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    scale = [1.0]
    grad_fn = ms.value_and_grad(lambda x: mint.sum(net(x, scale[0])), None, opt.parameters)
    x = ms.Tensor(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level)
    try:
        for s in (1.0, 200.0):
            scale[0] = s
            debugger.start(net)
            _, grads = grad_fn(x)
            opt(grads)
            debugger.stop()
            debugger.step()
    finally:
        debugger.close()
    culprit = analyze_overflow(str(tmp_path / "dump")).culprit
    assert (culprit.key, culprit.step, culprit.kind) == ("Mint.exp.0.forward", 1, "origin")
    assert culprit.record["output"][0]["Max"] == "inf"
    assert any("test_overflow_mindspore.py" in line for line in culprit.stack)

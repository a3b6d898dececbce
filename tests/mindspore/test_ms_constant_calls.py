"""Calls whose inputs are all constants inside value_and_grad (a causal mask sliced from a buffer,
`const * 2.0`, `ops.ones`, `const.reshape`) take no gradient: the dump records them in forward, hooks
nothing on them, and the training step runs as it does undumped, at every level and both ways of
hooking (capture/backward.py)."""

import glob
import json
import os

import numpy as np
import pytest

from private_modules import load_private

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
from mindspore import nn, ops  # noqa: E402

MODELS = load_private("msprobe_ms_test_models", os.path.join(os.path.dirname(__file__), "models.py"))


class CausalBlock(nn.Cell):
    """A causal self-attention block written the usual MindSpore way: the mask is a buffer sliced
    to the sequence length and turned into an additive bias inside construct."""

    def __init__(self, dim=8, max_len=8, jit_head=False):
        super().__init__()
        self.ln = nn.LayerNorm((dim,))
        self.qkv = nn.Dense(dim, 3 * dim)
        self.proj = nn.Dense(dim, dim)
        self.head = nn.Dense(dim, 2)
        if jit_head:
            self.head.construct = ms.jit(self.head.construct)
        self.mask = ms.Tensor(np.tril(np.ones((max_len, max_len), np.float32)))
        self.dim = dim

    def construct(self, x):
        t = x.shape[1]
        q, k, v = ops.split(self.qkv(self.ln(x)), self.dim, axis=-1)
        scores = ops.matmul(q, k.swapaxes(-1, -2)) / (self.dim ** 0.5)
        m = self.mask[:t, :t]
        bias = (1.0 - m) * -1e9 * 2.0
        bias = bias * ops.ones((t, t), ms.float32)
        scores = scores + bias.reshape(1, t, t)
        att = ops.softmax(scores, axis=-1)
        h = x + self.proj(ops.matmul(att, v))
        return self.head(h.mean(axis=1))


def _train(debugger, jit_head=False):
    ms.set_seed(3)
    net = CausalBlock(jit_head=jit_head)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    loss_fn = nn.MSELoss()
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((2, 6, 8)).astype(np.float32))
    y = ms.Tensor(rng.standard_normal((2, 2)).astype(np.float32))
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    return MODELS.run_steps(grad_fn, opt, x, y, 2, debugger, net)


@pytest.mark.parametrize("jit_head", [False, True], ids=["pynative", "jit"])
@pytest.mark.parametrize("synchronous", [True, False], ids=["views", "hookbackward"])
@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_constant_calls_are_recorded_and_training_runs(tmp_path, monkeypatch, level, synchronous, jit_head):
    from msprobe.mindspore import PrecisionDebugger
    from msprobe.mindspore.sync_execution import SynchronousOps
    if not synchronous:
        monkeypatch.setattr(SynchronousOps, "synchronous", staticmethod(lambda: False))
    plain = _train(None, jit_head)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    assert _train(debugger, jit_head) == plain
    debugger.close()
    root = tmp_path / "pynative" if (tmp_path / "pynative").is_dir() else tmp_path  # jit Cells at L0/mix
    files = sorted(glob.glob(str(root / "step*" / "*" / "dump.json")))
    assert len(files) == 2, files
    data = json.load(open(files[0]))["data"]
    if level == "L0":
        assert any(k.startswith("Cell.proj.Dense.backward") for k in data)
        return
    keys = list(data)
    # the constant calls: forward records, no backward ones
    getitem = [k for k in keys if k.startswith("Tensor.__getitem__") and k.endswith(".forward")]
    assert getitem, keys
    ones = [k for k in keys if ".ones." in k]
    assert ones and all(k.endswith(".forward") for k in ones), ones
    reshape = [k for k in keys if k.startswith("Tensor.reshape.")]
    assert reshape and all(k.endswith(".forward") for k in reshape), reshape
    # the calls on the gradient's path keep their backward records
    assert any(k.startswith("Functional.softmax.") and k.endswith(".backward") for k in keys), keys
    assert any(k.startswith("Functional.split.") and k.endswith(".backward") for k in keys), keys

"""A MindSpore statistics dump reads each piece of memory once per batch and each Parameter once before
the optimizer's step, and still records what every tensor held: views at other offsets of one buffer
keep their own statistics, the optimizer's update records show the weights before and after it and the
gradients the backward pass produced."""

import os

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

from msprobe.core.dump.reader import DumpReader  # noqa: E402

PID = os.getpid()


def stats(a):
    a = np.asarray(a, dtype=np.float64)
    return {"Max": a.max(), "Min": a.min(), "Mean": a.mean(), "Norm": np.sqrt((a * a).sum())}


def assert_stats(rec, expected, what):
    for k, v in expected.items():
        assert rec[k] == pytest.approx(v, rel=1e-5, abs=1e-6), f"{what} {k}"


@pytest.mark.parametrize("dim", [0, -1])
def test_views_at_other_offsets_of_one_buffer_keep_their_own_statistics(tmp_path, dim):
    """mint.chunk's three outputs have one shape and one stride, at three offsets of one buffer
    (along dim 0 each is contiguous, along the last dim strided)."""
    from mindspore import mint

    from msprobe.mindspore import PrecisionDebugger
    x = ms.Tensor(np.arange(72, dtype=np.float32).reshape(6, 12) * np.float32(0.5) - 3)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    debugger.start()
    parts = mint.chunk(x * 1.0, 3, dim)
    total = parts[0] + parts[1] + parts[2]
    debugger.stop()
    debugger.step()
    debugger.close()
    r = DumpReader(os.path.join(tmp_path, "step0", f"proc{PID}"))
    outs = r["Mint.chunk.0.forward"]["output"]
    for rec, part in zip(outs, np.split(x.asnumpy(), 3, axis=dim)):
        assert_stats(rec, stats(part), f"chunk output {rec}")
    assert_stats(r["Tensor.__add__.1.forward"]["output"][0], stats(total.asnumpy()), "sum")


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_optimizer_updates_show_weights_before_and_after_and_the_gradients(models, tmp_path, level):
    """Two iterations in one dump step: each update record's weight before is what the forward pass
    used, its gradient what the backward pass produced, its output the weight after the step."""
    from mindspore import mint, nn

    from msprobe.mindspore import PrecisionDebugger
    net = models.build("mlp")
    x, y = (ms.Tensor(a) for a in models.make_data("mlp"))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.5)
    grad_fn = ms.value_and_grad(lambda xb, yb: mint.mean((net(xb) - yb) ** 2), None, opt.parameters)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    weights, grads_seen = [], []
    debugger.start(net)
    for _ in range(2):
        weights.append(net.fc1.weight.asnumpy().copy())
        _, grads = grad_fn(x, y)
        grads_seen.append(grads[0].asnumpy().copy())  # fc1.weight's gradient: the first trainable Parameter
        opt(grads)
    weights.append(net.fc1.weight.asnumpy().copy())
    debugger.stop()
    debugger.step()
    debugger.close()
    assert not np.array_equal(weights[0], weights[1])
    r = DumpReader(os.path.join(tmp_path, "step0", f"proc{PID}"))
    for i in range(2):
        rec = r[f"Optimizer.SGD.fc1.weight.{i}.forward"]
        assert_stats(rec["input_args"][0], stats(weights[i]), f"update {i}: weight before")
        assert_stats(rec["input_args"][1], stats(grads_seen[i]), f"update {i}: gradient")
        assert_stats(rec["output"][0], stats(weights[i + 1]), f"update {i}: weight after")

"""In-place APIs get backward records at L1 (Tensor.register_hook on the changed tensor and the result,
so the call still changes the caller's own tensor), with the gradients value_and_grad computes, and the
loss is the same with and without the tool."""

import os

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

from msprobe.core.dump.reader import DumpReader  # noqa: E402

PID = os.getpid()


def net(a, b):
    y = ms.mint.mul(a, 2.0)  # [2, 4, 6]
    y[0] = 10.0  # truly in place: y is [10, 4, 6]
    z = y.add_(b)  # MindSpore's CPU build returns a new tensor here: [20, 24, 36]
    return ms.mint.sum(z * z)


def run(debugger=None):
    a = ms.Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    b = ms.Tensor(np.array([10.0, 20.0, 30.0], np.float32))
    if debugger is not None:
        debugger.start()
    loss, (ga, gb) = ms.value_and_grad(net, (0, 1))(a, b)
    if debugger is not None:
        debugger.stop()
        debugger.step()
    return float(loss.asnumpy()), ga.asnumpy(), gb.asnumpy()


def assert_stats(rec, values, what):
    v = np.asarray(values, np.float64)
    assert rec["Max"] == pytest.approx(v.max()), what
    assert rec["Min"] == pytest.approx(v.min()), what
    assert rec["Norm"] == pytest.approx(np.sqrt((v * v).sum()), rel=1e-6), what


def test_in_place_calls_have_backward_records(tmp_path):
    from msprobe.mindspore import PrecisionDebugger
    plain = run()
    loss, ga, gb = run(PrecisionDebugger(dump_path=str(tmp_path), level="L1"))
    assert loss == plain[0] == 20.0 ** 2 + 24.0 ** 2 + 36.0 ** 2
    np.testing.assert_array_equal(ga, plain[1])
    r = DumpReader(os.path.join(tmp_path, "step0", f"proc{PID}"))
    assert [k for k in r.keys() if k.endswith(".backward")] == [
        "Mint.sum.0.backward", "Tensor.__mul__.0.backward", "Tensor.add_.0.backward",
        "Tensor.__setitem__.0.backward", "Mint.mul.0.backward"]
    dz = [40.0, 48.0, 72.0]  # d loss / d z = 2 z
    add = r["Tensor.add_.0.backward"]
    assert_stats(add["input"][0], dz, "add_ result")
    assert_stats(add["output"][0], dz, "add_ self")
    assert_stats(add["output"][1], gb, "add_ other")  # the gradient value_and_grad returns for b
    setitem = r["Tensor.__setitem__.0.backward"]
    assert_stats(setitem["input"][0], dz, "y after the write")
    assert_stats(setitem["output"][0], [0.0, 48.0, 72.0], "y before the write")  # y[0] was overwritten
    assert_stats(r["Mint.mul.0.backward"]["output"][0], ga, "a")
    assert r["Tensor.__mul__.0.forward"]["input_args"][0]["Max"] == 36.0  # the forward saw the changes

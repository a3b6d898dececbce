"""Parameter statistics in MindSpore dumps are the values each call saw: the session reads the model's
trainable Parameters together (session.param_record) and must read them again once the optimizer may
have changed them, also when two training iterations fall inside one dump step."""

import os

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

from msprobe.core.dump.reader import DumpReader  # noqa: E402

PID = os.getpid()


def stats(a):
    a = a.astype(np.float64)
    return {"Max": a.max(), "Min": a.min(), "Mean": a.mean(), "Norm": np.sqrt((a * a).sum())}


def assert_stats(rec, expected, what):
    for k, v in expected.items():
        assert rec[k] == pytest.approx(v, rel=1e-5, abs=1e-6), f"{what} {k}"


def two_iterations_in_one_step(models, tmp_path, level):
    """start(net); 2 x (value_and_grad + SGD); stop; step. Returns (reader, fc1 weights before each
    iteration)."""
    from mindspore import mint, nn

    from msprobe.mindspore import PrecisionDebugger
    net = models.build("mlp")
    x, y = (ms.Tensor(a) for a in models.make_data("mlp"))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.5)  # large steps: the weights visibly move
    grad_fn = ms.value_and_grad(lambda xb, yb: mint.mean((net(xb) - yb) ** 2), None, opt.parameters)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    weights = []
    debugger.start(net)
    for _ in range(2):
        weights.append(net.fc1.weight.asnumpy().copy())
        _, grads = grad_fn(x, y)
        opt(grads)
    debugger.stop()
    debugger.step()
    debugger.close()
    assert not np.array_equal(weights[0], weights[1])
    return DumpReader(os.path.join(tmp_path, "step0", f"proc{PID}")), weights


def test_l0_cell_parameters_are_read_again_after_the_optimizer(models, tmp_path):
    r, weights = two_iterations_in_one_step(models, tmp_path, "L0")
    for i, w in enumerate(weights):
        assert_stats(r[f"Cell.fc1.Linear.forward.{i}"]["parameters"]["weight"], stats(w), f"iteration {i}")


def test_l1_parameter_inputs_are_read_again_after_the_optimizer(models, tmp_path):
    r, weights = two_iterations_in_one_step(models, tmp_path, "L1")
    # Dense.0 / Dense.3: fc1 in the first and the second iteration (3 Dense calls per forward)
    for i, w in zip((0, 3), weights):
        rec = r[f"Primitive.dense.Dense.{i}.forward"]
        assert rec["input_args"][1]["shape"] == [32, 16]
        assert_stats(rec["input_args"][1], stats(w), f"Dense.{i}")


def test_parameters_of_every_step_match_the_weights_before_its_update(models, tmp_path):
    root, _ = models.run_dump(tmp_path, "transformer", "mix")
    net = models.build("transformer")
    x, y = models.make_data("transformer")
    before = [net.attn.q.weight.asnumpy().copy()]
    models.train(net, x, y, steps=1)
    before.append(net.attn.q.weight.asnumpy().copy())
    for step, w in enumerate(before):
        r = DumpReader(os.path.join(root, f"step{step}", f"proc{PID}"))
        assert_stats(r["Cell.attn.q.Linear.forward.0"]["parameters"]["weight"], stats(w), f"step {step}")

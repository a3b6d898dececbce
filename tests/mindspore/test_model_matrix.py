"""The issue's matrix beyond test_dump_levels: every model in md5 and tensor mode at mix (L0 and L1 keys
together), every model under Model.train + MsprobeStep, and mindspore.grad as the way backward runs."""

import os
import re

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

from msprobe.core.dump.reader import DumpReader  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402

PID = os.getpid()


def tensor_records(value):
    if isinstance(value, dict) and value.get("type") == "mindspore.Tensor":
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensor_records(v)
    elif isinstance(value, list):
        for v in value:
            yield from tensor_records(v)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
@pytest.mark.parametrize("task,summary", [("statistics", "md5"), ("tensor", None)])
def test_every_model_md5_and_tensor_at_mix(models, tmp_path, name, task, summary):
    root, losses = models.run_dump(tmp_path, name, "mix", task, summary, steps=1)
    r = DumpReader(os.path.join(root, "step0", f"proc{PID}"))
    kinds = {k.split(".", 1)[0] for k in r.keys()}
    assert {"Cell", "Primitive"} <= kinds and kinds & {"Mint", "MintFunctional", "Tensor", "Functional"}
    n = 0
    for key, rec in r.items():
        for t in tensor_records(rec):
            if task == "tensor":
                assert os.path.isfile(os.path.join(r.rank_dir, "dump_tensor_data", t["data_name"]))
            else:
                assert re.fullmatch(r"[0-9a-f]{8}", t["md5"]), key  # CRC-32
            n += 1
    assert n > 20
    assert any(".backward" in k for k in r.keys()) and any("parameters_grad" in k for k in r.keys())


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_model_train_mix_for_the_other_models(models, tmp_path, name):
    x, y = models.make_data(name, batch=8)
    plain = models.train_with_model(models.build(name), x, y)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="mix")
    assert models.train_with_model(models.build(name), x, y, debugger=debugger) == plain
    for step in (0, 1):
        keys = list(DumpReader(os.path.join(tmp_path, f"step{step}", f"proc{PID}")).keys())
        assert "Cell.head.Linear.parameters_grad.0" in keys and "Cell.head.Linear.backward.0" in keys
        assert "Primitive.dense.Dense.0.backward" in keys


def test_backward_through_mindspore_grad(models, tmp_path):
    """mindspore.grad with respect to the input: the first call's backward output is that gradient."""
    net = models.build("mlp")
    x, y = models.make_data("mlp")
    xt = ms.Tensor(x)

    def fn(inp):
        return ms.mint.mean((net(inp) - ms.Tensor(y)) ** 2)
    expected = ms.grad(fn, grad_position=0)(xt).asnumpy()
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="L1", task="tensor")
    debugger.start(net)
    got = ms.grad(fn, grad_position=0)(xt).asnumpy()
    debugger.stop()
    debugger.step()
    np.testing.assert_array_equal(got, expected)
    r = DumpReader(os.path.join(tmp_path, "step0", f"proc{PID}"))
    rec = r["Primitive.dense.Dense.0.backward"]["output"][0]  # gradient of the first dense's input x
    saved = np.load(os.path.join(r.rank_dir, "dump_tensor_data", rec["data_name"]))
    np.testing.assert_allclose(saved, expected, rtol=1e-6, atol=1e-8)

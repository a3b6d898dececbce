"""mindspore.jit inside a PyNative run: a jit-compiled Cell at L0/mix splits the dump into graph/ and
pynative/ (seed 000), recorded at its border, the Cells inside it left alone (a hook there would be
compiled into the graph), with one warning naming what the CPU build lacks for them (TensorDump);
at L1 jit-compiled Cells and functions are APIs `Jit.{name}` with forward and backward."""

import json
import logging
import os

import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

from msprobe.core.dump.reader import DumpReader  # noqa: E402

PID = os.getpid()


@pytest.fixture(scope="module")
def plain_losses(models):
    x, y = models.make_data("jit")
    return models.train(models.build("jit"), x, y)


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_jit_cell_splits_graph_and_pynative(models, tmp_path, caplog, plain_losses, level):
    with caplog.at_level(logging.WARNING, logger="msprobe.mindspore.debugger"):
        root, losses = models.run_dump(tmp_path, "jit", level)
    assert losses == plain_losses
    assert sorted(os.listdir(root)) == ["graph", "pynative"]
    for step in (0, 1):
        graph = DumpReader(os.path.join(root, "graph", f"step{step}", f"proc{PID}"))
        pyn = DumpReader(os.path.join(root, "pynative", f"step{step}", f"proc{PID}"))
        assert list(graph.keys()) == ["Cell.block.JitBlock.forward.0"]
        assert graph["Cell.block.JitBlock.forward.0"] == pyn["Cell.block.JitBlock.forward.0"]  # recorded twice
        keys = list(pyn.keys())
        assert {"Cell.inp.Linear.forward.0", "Cell.head.Linear.backward.0",
                "Cell.block.JitBlock.backward.0"} <= set(keys)
        assert not any(k.startswith("Cell.block.fc") for k in keys)  # inside the compiled graph
        assert graph.construct == {"Cell.block.JitBlock.forward.0": None}
    warnings = [r.getMessage() for r in caplog.records if "jit-compiled" in r.getMessage()]
    assert len(warnings) == 1 and "block (JitBlock)" in warnings[0] and "TensorDump" in warnings[0]


def test_jit_at_l1_is_an_api_with_backward(models, tmp_path, plain_losses):
    root, losses = models.run_dump(tmp_path, "jit", "L1")
    assert losses == plain_losses
    r = DumpReader(os.path.join(root, "step0", f"proc{PID}"))
    keys = list(r.keys())
    assert keys.index("Jit.JitBlock.0.forward") < keys.index("Primitive.dense.Dense.1.forward")
    fwd, bwd = r["Jit.JitBlock.0.forward"], r["Jit.JitBlock.0.backward"]
    assert fwd["input_args"][0] is None  # the Cell itself
    assert fwd["input_args"][1]["shape"] == [4, 16] and fwd["output"][0]["Min"] >= 0  # after its ReLU
    # backward output i: gradient of the i-th tensor input (the Cell is no tensor)
    assert bwd["input"][0]["shape"] == [4, 16] and bwd["output"][0]["shape"] == [4, 16]
    assert keys[-1].startswith("Optimizer.SGD.")  # the optimizer: one record per parameter update
    with open(os.path.join(root, "step0", f"proc{PID}", "construct.json")) as f:
        assert json.load(f) == {}


def test_set_init_step_after_start_renumbers_graph_and_pynative(models, tmp_path):
    """MsprobeInitStep calls set_init_step after start() has opened the step: both halves of a jit
    dump take the new number."""
    from msprobe.mindspore import PrecisionDebugger
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    net = models.build("jit")
    x, y = models.make_data("jit")
    debugger.start(net)
    debugger.set_init_step(5)
    models.train(net, x, y, steps=1, debugger=debugger)
    debugger.close()
    assert os.listdir(tmp_path / "graph") == ["step5"]
    assert os.listdir(tmp_path / "pynative") == ["step5"]


class _EvalNet(ms.nn.Cell):
    """A Cell holding a Primitive (what L1 wraps) whose construct mindspore.jit compiles."""

    def __init__(self):
        super().__init__()
        self.dense = ms.nn.Dense(4, 4)
        self.relu = ms.ops.ReLU()

    def construct(self, x):
        return ms.mint.abs(self.relu(self.dense(x)) + x)


@ms.jit
def _eval_fn(x):
    return ms.mint.abs(ms.ops.relu(x) + x)


def test_jit_compiles_between_dumped_steps(tmp_path):
    """The L1 wrappers stay installed between dumped steps; code compiled by mindspore.jit there (an
    evaluation step) must compile and compute what it does without msprobe, also for a model whose
    Primitives were wrapped during the step."""
    import numpy as np
    from msprobe.mindspore import PrecisionDebugger
    net = _EvalNet()
    x = ms.Tensor(np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32))
    want_fn, want_net = _eval_fn(x).asnumpy(), net(x).asnumpy()
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    for step in range(2):
        debugger.start(net)
        net(x)
        debugger.stop()
        debugger.step()
        assert hasattr(ms.mint.abs, "__msprobe_original__")  # idle wrappers, as this test means
        assert (_eval_fn(x).asnumpy() == want_fn).all()
        assert (ms.jit(net.construct)(x).asnumpy() == want_net).all()
    debugger.close()
    keys = list(DumpReader(os.path.join(str(tmp_path), "step1", f"proc{PID}")).keys())
    # the step's own calls were recorded, the compiled ones between steps were not
    assert keys[-3:] == ["Primitive.relu.ReLU.0.forward", "Tensor.__add__.0.forward", "Mint.abs.0.forward"]
    assert not any(k.startswith("Jit.") for k in keys)

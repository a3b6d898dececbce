"""PyNative dumps of three real models (mint MLP, CNN, transformer block) trained two steps with
value_and_grad + SGD, at L0, L1 and mix, in statistics, md5 and tensor modes: keys, dtypes, layout,
numbers checked against numpy and against the tensors the same run saved; non-interference."""

import json
import os
import re
import zlib

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

from msprobe.core.dump.reader import DumpReader, find_rank_dirs  # noqa: E402

PID = os.getpid()


@pytest.fixture(scope="module")
def dumps(models, tmp_path_factory):
    """(model, level, task, summary_mode) -> (root, losses); each run once per module."""
    cache = {}

    def get(name, level, task="statistics", summary_mode=None):
        k = (name, level, task, summary_mode)
        if k not in cache:
            cache[k] = models.run_dump(tmp_path_factory.mktemp(f"{name}_{level}_{task}"), name, level, task,
                                       summary_mode)
        return cache[k]
    return get


def reader(root, step=0):
    return DumpReader(os.path.join(root, f"step{step}", f"proc{PID}"))


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
def test_losses_equal_with_and_without_the_tool(models, dumps, name):
    net = models.build(name)
    x, y = models.make_data(name)
    plain = models.train(net, x, y)
    for level in ("L0", "L1", "mix"):
        _, losses = dumps(name, level)
        assert losses == plain, level  # bit-identical: the tool only observes


def test_layout_envelope_and_steps(dumps):
    root, _ = dumps("mlp", "mix")
    dirs = find_rank_dirs(root)
    assert [(d.step, d.is_proc) for d in dirs] == [(0, True), (1, True)]
    for step in (0, 1):
        rank_dir = os.path.join(root, f"step{step}", f"proc{PID}")
        # msProbe's three files, and ours beside them: the Primitives' constructor arguments for acc_check
        assert sorted(os.listdir(rank_dir)) == ["api_sources.json", "construct.json", "dump.json", "stack.json"]
        with open(os.path.join(rank_dir, "dump.json")) as f:
            head = json.load(f)
        assert {k: head[k] for k in ("task", "level", "framework", "dump_data_dir")} == {
            "task": "statistics", "level": "mix", "framework": "mindspore", "dump_data_dir": None}


def test_l1_mlp_keys_and_records(dumps):
    root, _ = dumps("mlp", "L1")
    r = reader(root)
    forward = [k for k in r.keys() if k.endswith(".forward")]
    params = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "head.weight", "head.bias"]
    assert forward == ["Primitive.dense.Dense.0.forward", "MintFunctional.relu.0.forward",
                       "Primitive.dense.Dense.1.forward", "Mint.tanh.0.forward", "Tensor.__add__.0.forward",
                       "Primitive.dense.Dense.2.forward", "Tensor.__sub__.0.forward", "Tensor.__pow__.0.forward",
                       "Mint.mean.0.forward"] + [f"Optimizer.SGD.{p}.0.forward" for p in params]
    backward = [k for k in r.keys() if k.endswith(".backward")]
    # every differentiable call has a backward record (the optimizer runs outside the gradient)
    assert set(backward) == {k.replace(".forward", ".backward") for k in forward[:-len(params)]}
    assert backward[:3] == ["Mint.mean.0.backward", "Tensor.__pow__.0.backward", "Tensor.__sub__.0.backward"]
    keys = list(r.keys())
    assert keys[-len(params):] == forward[-len(params):]  # the optimizer runs after the backward
    # one record per parameter update: the parameter before, its gradient, the parameter after
    upd = r["Optimizer.SGD.head.weight.0.forward"]
    before, grad = upd["input_args"]
    after = upd["output"][0]
    assert before["shape"] == grad["shape"] == after["shape"] == [4, 32]
    assert before["Norm"] != after["Norm"] and grad["Norm"] > 0
    assert r["Optimizer.SGD.head.weight.0.forward"]["input_args"][1] == \
        r["Primitive.dense.Dense.2.backward"]["output"][1]  # the gradient Dense's backward made
    rec = r["Tensor.__pow__.0.forward"]
    assert rec["input_args"][1] == {"type": "int", "value": 2}
    assert rec["input_args"][0]["dtype"] == "Float32" and rec["input_args"][0]["shape"] == [4, 4]
    dense = r["Primitive.dense.Dense.0.forward"]
    assert [a["shape"] for a in dense["input_args"]] == [[4, 16], [32, 16], [32]]  # x, weight, bias
    assert r.construct == {}  # L1: no hierarchy
    bwd = r["MintFunctional.relu.0.backward"]
    assert set(bwd) == {"input", "output"} and bwd["input"][0]["shape"] == [4, 32]
    # relu backward: the gradient is zero exactly where the forward output was zero
    assert bwd["output"][0]["Norm"] <= bwd["input"][0]["Norm"] + 1e-6


def test_l0_keys_parameters_and_hierarchy(dumps):
    root, _ = dumps("transformer", "L0")
    r = reader(root)
    keys = list(r.keys())
    assert all(k.startswith("Cell.") for k in keys)
    assert "Cell.attn.q.Linear.forward.0" in keys and "Cell.mlp.0.Linear.forward.0" in keys
    assert "Cell.mlp.1.GELU.forward.0" in keys and "Cell.mlp.SequentialCell.forward.0" in keys
    fwd = r["Cell.attn.q.Linear.forward.0"]
    assert set(fwd) == {"input_args", "input_kwargs", "output", "parameters"}
    assert set(fwd["parameters"]) == {"weight", "bias"}
    assert fwd["parameters"]["weight"]["shape"] == [16, 16]
    grads = r["Cell.attn.q.Linear.parameters_grad.0"]
    assert set(grads) == {"weight", "bias"} and grads["weight"][0]["shape"] == [16, 16]
    assert r["Cell.attn.q.Linear.backward.0"]["input"][0]["shape"] == [4, 6, 16]
    c = r.construct
    assert c["Cell.attn.q.Linear.forward.0"] == "Cell.attn.Attention.forward.0"
    assert c["Cell.attn.Attention.forward.0"] is None  # the root is not recorded
    assert c["Cell.mlp.0.Linear.backward.0"] == "Cell.mlp.SequentialCell.backward.0"
    # backward runs from the head back to the input
    order = [k for k in keys if ".backward." in k]
    assert order.index("Cell.head.Linear.backward.0") < order.index("Cell.norm1.LayerNorm.backward.0")


def test_mix_apis_have_their_cell_as_parent(dumps):
    root, _ = dumps("cnn", "mix")
    r = reader(root)
    c = r.construct
    assert c["Primitive.conv2d.Conv2D.0.forward"] == "Cell.conv1.Conv2d.forward.0"
    assert c["Primitive.max_pool.MaxPool.0.forward"] == "Cell.pool.MaxPool2d.forward.0"
    assert c["Primitive.conv2d.Conv2D.0.backward"] == "Cell.conv1.Conv2d.backward.0"
    assert c["Cell.conv1.Conv2d.forward.0"] is None
    keys = list(r.keys())
    # an API's forward record precedes its Cell's (the Cell ends after the API)
    assert keys.index("Primitive.conv2d.Conv2D.0.forward") < keys.index("Cell.conv1.Conv2d.forward.0")
    # second call of the shared ReLU cell
    assert "Cell.relu.ReLU.forward.1" in keys and "Cell.relu.ReLU.backward.1" in keys
    stack = r.stack
    assert any("models.py" in line and "construct" in line for line in stack["Cell.conv1.Conv2d.forward.0"])


def test_statistics_equal_numpy_of_the_saved_tensors(dumps):
    root, _ = dumps("cnn", "mix", "tensor")
    r = reader(root)
    checked = 0
    for key, rec in r.items():
        for t in tensor_records(rec):
            arr = np.load(os.path.join(r.rank_dir, "dump_tensor_data", t["data_name"]))
            assert list(arr.shape) == t["shape"], t["data_name"]
            a = arr.astype(np.float64)
            assert t["Max"] == pytest.approx(a.max(), rel=1e-6, abs=1e-7)
            assert t["Min"] == pytest.approx(a.min(), rel=1e-6, abs=1e-7)
            assert t["Mean"] == pytest.approx(a.mean(), rel=1e-4, abs=1e-6)
            assert t["Norm"] == pytest.approx(np.sqrt((a * a).sum()), rel=1e-5, abs=1e-6)
            checked += 1
    assert checked > 100
    data_files = set(os.listdir(os.path.join(r.rank_dir, "dump_tensor_data")))
    assert "Cell.conv1.Conv2d.forward.0.parameters.weight.npy" in data_files
    assert "Cell.conv1.Conv2d.parameters_grad.0.weight.npy" in data_files
    assert "Primitive.conv2d.Conv2D.0.backward.output.1.npy" in data_files  # the weight; x is data
    assert "Primitive.conv2d.Conv2D.1.backward.output.0.npy" in data_files
    assert r.dump_data_dir == os.path.join(os.path.abspath(r.rank_dir), "dump_tensor_data")


def test_forward_numbers_follow_from_the_parameters(dumps):
    """Cell.fc1 output = x @ W.T + b, recomputed from the saved input and parameters."""
    root, _ = dumps("mlp", "L0", "tensor")
    r = reader(root)
    d = os.path.join(r.rank_dir, "dump_tensor_data")
    rec = r["Cell.fc1.Linear.forward.0"]
    x = np.load(os.path.join(d, rec["input_args"][0]["data_name"]))
    w = np.load(os.path.join(d, rec["parameters"]["weight"]["data_name"]))
    b = np.load(os.path.join(d, rec["parameters"]["bias"]["data_name"]))
    out = np.load(os.path.join(d, rec["output"][0]["data_name"]))
    np.testing.assert_allclose(out, x @ w.T + b, rtol=1e-5, atol=1e-6)


def test_parameter_gradients_equal_value_and_grad(models, dumps):
    root, _ = dumps("mlp", "L0", "tensor")
    r = reader(root)
    net = models.build("mlp")
    x, y = models.make_data("mlp")
    opt_params = net.trainable_params()

    def loss_fn(xb, yb):
        return ms.mint.mean((net(xb) - yb) ** 2)
    _, grads = ms.value_and_grad(loss_fn, None, opt_params)(ms.Tensor(x), ms.Tensor(y))
    by_name = {p.name: g.asnumpy() for p, g in zip(opt_params, grads)}
    d = os.path.join(r.rank_dir, "dump_tensor_data")
    for cell in ("fc1", "fc2", "head"):
        rec = r[f"Cell.{cell}.Linear.parameters_grad.0"]
        saved = np.load(os.path.join(d, rec["weight"][0]["data_name"]))
        np.testing.assert_allclose(saved, by_name[f"{cell}.weight"], rtol=1e-6, atol=1e-7)


def test_md5_is_the_crc32_of_the_tensor_bytes(dumps):
    """msProbe's value: zlib's CRC-32 of the tensor's bytes, 8 hex digits."""
    root_md5, _ = dumps("mlp", "L1", "statistics", "md5")
    root_t, _ = dumps("mlp", "L1", "tensor")
    r5, rt = reader(root_md5), reader(root_t)
    assert list(r5.keys()) == list(rt.keys())
    n = 0
    for key, rec in rt.items():
        for t5, tt in zip(tensor_records(r5[key]), tensor_records(rec)):
            assert re.fullmatch(r"[0-9a-f]{8}", t5["md5"])
            arr = np.load(os.path.join(rt.rank_dir, "dump_tensor_data", tt["data_name"]))
            assert t5["md5"] == f"{zlib.crc32(arr.tobytes()):08x}"
            assert t5["Max"] == tt["Max"] and t5["Norm"] == tt["Norm"]
            n += 1
    assert n > 40


def test_bfloat16_tensors_keep_every_bit(models, tmp_path):
    """bf16 has no numpy dtype: .npy holds float32, an exact upcast; dtype says BFloat16."""
    from msprobe.mindspore import PrecisionDebugger
    x = ms.Tensor(np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)).astype(ms.bfloat16)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="tensor", level="L1")
    debugger.start()
    y = ms.mint.mul(x, x)  # one of the few bf16 kernels of the CPU build
    debugger.stop()
    debugger.step()
    r = reader(tmp_path)
    rec = r["Mint.mul.0.forward"]
    assert rec["input_args"][0]["dtype"] == "BFloat16" and rec["output"][0]["dtype"] == "BFloat16"
    saved = np.load(os.path.join(r.rank_dir, "dump_tensor_data", "Mint.mul.0.forward.output.0.npy"))
    assert saved.dtype == np.float32
    np.testing.assert_array_equal(saved, y.astype(ms.float32).asnumpy())
    assert rec["output"][0]["Max"] == 9.0
    xf = x.astype(ms.float32).asnumpy()
    assert not np.array_equal(saved, xf * xf)  # the bf16-rounded product, not a float32 recompute


def test_structure_task_writes_hierarchy_only(models, tmp_path):
    root, _ = models.run_dump(tmp_path, "mlp", "mix", "structure")
    r = reader(root)
    assert len(r) == 0
    assert r.construct["Primitive.dense.Dense.0.forward"] == "Cell.fc1.Linear.forward.0"
    assert "Cell.fc1.Linear.forward.0" in r.stack


def test_non_finite_scalars_and_statistics_are_strict_json(tmp_path):
    """The MindSpore writer trusts its records to hold no NaN/inf float (finite_records): scalar
    arguments (masked_fill(mask, -inf)) and statistics of non-finite tensors must arrive as strings."""
    from msprobe.mindspore import PrecisionDebugger

    def no_constants(name):
        raise AssertionError(f"bare {name} in dump.json")

    scores = ms.Tensor(np.arange(8, dtype=np.float32).reshape(2, 4))
    mask = ms.Tensor(np.array([[True, False, False, True]] * 2))
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    debugger.start()
    ms.mint.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
    ms.mint.add(ms.Tensor(np.ones(3, np.float32)), float("nan"))
    debugger.stop()
    debugger.step()
    (rank_dir,) = find_rank_dirs(str(tmp_path))
    with open(os.path.join(rank_dir.path, "dump.json"), encoding="utf-8") as f:
        data = json.load(f, parse_constant=no_constants)["data"]
    fill = data["Tensor.masked_fill.0.forward"]
    assert fill["input_args"][2] == {"type": "float", "value": "-inf"}
    assert fill["output"][0]["Min"] == "-inf" and fill["output"][0]["Mean"] == "-inf"
    assert fill["output"][0]["Max"] == 6.0
    add = data["Mint.add.0.forward"]
    assert add["input_args"][1] == {"type": "float", "value": "nan"}
    assert add["output"][0]["Max"] == "nan" and add["output"][0]["Norm"] == "nan"

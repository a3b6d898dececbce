"""The other ways in and the filters: Model.train with MsprobeStep / MsprobeInitStep, scope, list,
data_mode, step, rank, tensor_list, level debug (`save`), token_range and rank_id, a list of models,
register_custom_api, start/stop segments, seed_all, and one-line errors for bad input."""

import json
import os

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

from msprobe.core.dump.reader import DumpReader  # noqa: E402
from msprobe.core.errors import ConfigError, MsprobeError  # noqa: E402
from msprobe.mindspore import MsprobeInitStep, MsprobeStep, PrecisionDebugger, seed_all  # noqa: E402

PID = os.getpid()


def reader(root, step=0, rank=None):
    return DumpReader(os.path.join(root, f"step{step}", f"rank{rank}" if rank is not None else f"proc{PID}"))


def write_config(tmp_path, **fields):
    task = fields.get("task", "statistics")
    block = fields.pop("block", {})
    cfg = {"task": task, "dump_path": str(tmp_path / "dump"), **fields, task: block}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture(scope="module")
def mlp_l1(models, tmp_path_factory):
    """An unfiltered L1 statistics dump of one MLP step, to compare filtered runs against."""
    root, _ = models.run_dump(tmp_path_factory.mktemp("full"), "mlp", "mix", steps=1)
    return reader(root)


def run_mlp(models, tmp_path, steps=1, **fields):
    debugger = PrecisionDebugger(config_path=write_config(tmp_path, **fields))
    net = models.build("mlp")
    x, y = models.make_data("mlp")
    models.train(net, x, y, steps=steps, debugger=debugger)
    debugger.close()
    return tmp_path / "dump"


# -- mindspore.train.Model -----------------------------------------------------------------------
@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_model_train_with_msprobe_step(models, tmp_path, level):
    x, y = models.make_data("cnn", batch=8)
    plain = models.train_with_model(models.build("cnn"), x, y)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level=level)
    losses = models.train_with_model(models.build("cnn"), x, y, debugger=debugger)
    assert losses == plain and len(losses) == 2
    for step in (0, 1):
        r = reader(tmp_path, step)
        keys = list(r.keys())
        if level in ("L0", "mix"):
            assert "Cell.conv1.Conv2d.forward.0" in keys and "Cell.conv1.Conv2d.parameters_grad.0" in keys
            assert "Cell.fc.Dense.backward.0" in keys
        if level in ("L1", "mix"):
            assert "Primitive.conv2d.Conv2D.0.forward" in keys and "Primitive.conv2d.Conv2D.0.backward" in keys
            assert "Primitive.max_pool.MaxPool.0.backward" in keys
        if level == "L0":
            assert all(k.startswith("Cell.") for k in keys)
    assert not os.path.exists(tmp_path / "step2")


def test_msprobe_init_step_continues_the_step_count(models, tmp_path):
    from mindspore import nn
    from mindspore.train import Callback, Model
    import mindspore.dataset as ds

    class Resumed(Callback):  # what a resumed run's Model sets before on_train_begin
        def on_train_begin(self, run_context):
            run_context.original_args().cur_step_num = 5

    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    net = models.build("cnn")
    x, y = models.make_data("cnn", batch=4)
    debugger.start(net)
    data = ds.GeneratorDataset(lambda: iter([(x, y)]), ["x", "y"], shuffle=False)
    Model(net, loss_fn=nn.MSELoss(), optimizer=nn.SGD(net.trainable_params(), 0.01)).train(
        1, data, callbacks=[Resumed(), MsprobeInitStep(), MsprobeStep(debugger)], dataset_sink_mode=False)
    assert sorted(os.listdir(tmp_path)) == ["step5"]


# -- filters ---------------------------------------------------------------------------------------
def test_list_by_substring_and_full_name(models, tmp_path, mlp_l1):
    root = run_mlp(models, tmp_path, level="L1", block={"list": ["relu", "Mint.tanh.0.forward"]})
    r = reader(root)
    assert list(r.keys()) == ["MintFunctional.relu.0.forward", "Mint.tanh.0.forward", "Mint.tanh.0.backward",
                              "MintFunctional.relu.0.backward"]
    assert r["Mint.tanh.0.forward"] == mlp_l1["Mint.tanh.0.forward"]


def test_mix_list_with_a_cell_selects_everything_inside(models, tmp_path):
    root = run_mlp(models, tmp_path, level="mix", block={"list": ["Cell.fc2.Linear.forward.0"]})
    keys = set(reader(root).keys())
    assert {"Cell.fc2.Linear.forward.0", "Primitive.dense.Dense.1.forward"} <= keys
    assert "Primitive.dense.Dense.0.forward" not in keys and "Mint.tanh.0.forward" not in keys


def test_scope_keeps_the_calls_between_start_and_end(models, tmp_path, mlp_l1):
    root = run_mlp(models, tmp_path, level="mix",
                   block={"scope": ["MintFunctional.relu.0.forward", "Tensor.__add__.0.forward"]})
    fwd = [k for k in reader(root).keys() if k.endswith(".forward") or ".forward." in k]
    full = [k for k in mlp_l1.keys() if k.endswith(".forward") or ".forward." in k]
    i, j = full.index("MintFunctional.relu.0.forward"), full.index("Tensor.__add__.0.forward")
    assert fwd == full[i:j + 1]


@pytest.mark.parametrize("modes,want", [(["forward"], {"forward"}), (["backward"], {"backward"}),
                                        (["input"], {"forward", "backward"})])
def test_data_mode(models, tmp_path, modes, want):
    r = reader(run_mlp(models, tmp_path, level="L1", block={"data_mode": modes}))
    assert {k.rsplit(".", 1)[1] for k in r.keys()} == want
    if modes == ["input"]:
        assert all(rec.get("output", []) == [] for rec in r.data.values())
        assert r["Mint.tanh.0.forward"]["input_args"]


def test_step_rank_and_tensor_list(models, tmp_path):
    root = run_mlp(models, tmp_path, steps=3, level="L1", step=[1], block={"tensor_list": ["tanh"]})
    assert os.listdir(root) == ["step1"]
    r = reader(root, 1)
    files = os.listdir(os.path.join(r.rank_dir, "dump_tensor_data"))
    assert files and all("tanh" in f for f in files)
    assert "data_name" not in r["Primitive.dense.Dense.0.forward"]["output"][0]
    (tmp_path / "r").mkdir()
    other = run_mlp(models, tmp_path / "r", level="L1", rank=[1])
    assert not os.path.exists(other)  # no rank: proc{pid}, not rank 1 -> nothing dumped


# -- other ways in -----------------------------------------------------------------------------------
def test_debug_save_with_gradients(models, tmp_path):
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="debug", task="tensor")
    net = models.build("mlp")
    x, y = models.make_data("mlp")

    def loss_fn(xb, yb):
        out = net(xb)
        debugger.save(out, "logits")
        debugger.save({"a": out, "n": 3}, "bundle", save_backward=False)
        debugger.save(xb, "data")  # value_and_grad differentiates the weights only: no gradient reaches it
        return ms.mint.mean((out - yb) ** 2)
    (loss, _), = [ms.value_and_grad(loss_fn, None, net.trainable_params())(ms.Tensor(x), ms.Tensor(y))]
    debugger.step()
    r = reader(tmp_path)
    assert os.path.basename(r.dump_file) == "debug.json"
    assert list(r.keys()) == ["logits.0.debug", "bundle.0.debug", "data.0.debug", "logits_grad.0.debug",
                              "data_grad.0.debug"]
    assert r["data_grad.0.debug"] is None  # written null at the step's end, as PyTorch writes an unused one
    assert r["bundle.0.debug"]["n"] == {"type": "int", "value": 3}
    d = os.path.join(r.rank_dir, "dump_tensor_data")
    grad = np.load(os.path.join(d, r["logits_grad.0.debug"]["data_name"]))
    out = np.load(os.path.join(d, r["logits.0.debug"]["data_name"]))
    np.testing.assert_allclose(grad, 2 * (out - y) / y.size, rtol=1e-5, atol=1e-7)  # d mean(sq) / d out


def test_token_range_rank_id_and_model_list(models, tmp_path):
    x, _ = models.make_data("mlp")
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "tok"), level="L1")
    net = models.build("mlp")
    debugger.start(net, token_range=[1, 2], rank_id=3)
    for i in range(4):
        net(ms.Tensor(x * (i + 1)))  # token i sees x * (i + 1)
    debugger.stop()
    debugger.step()
    r = reader(tmp_path / "tok", rank=3)
    keys = list(r.keys())
    assert [k for k in keys if "tanh" in k] == ["Mint.tanh.0.forward", "Mint.tanh.1.forward"]
    assert [k for k in keys if "Dense" in k] == [f"Primitive.dense.Dense.{i}.forward" for i in range(6)]
    assert r["Primitive.dense.Dense.0.forward"]["input_args"][0]["Max"] == pytest.approx(2 * x.max())
    assert r["Primitive.dense.Dense.3.forward"]["input_args"][0]["Max"] == pytest.approx(3 * x.max())

    debugger = PrecisionDebugger(dump_path=str(tmp_path / "lst"), level="L0")
    a, b = models.build("mlp"), models.build("mlp")
    debugger.start([a, b])
    a(ms.Tensor(x))
    b(ms.Tensor(x))
    debugger.stop()
    debugger.step()
    assert list(reader(tmp_path / "lst").keys()) == [f"Cell.{i}.{n}.Linear.forward.0" for i in (0, 1)
                                                      for n in ("fc1", "fc2", "head")]


def test_custom_api_and_start_stop_segments(tmp_path):
    import types
    lib = types.SimpleNamespace(scale=lambda t, k: t * k)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    debugger.register_custom_api(lib, "scale", "MyLib")
    x = ms.Tensor(np.ones((2, 3), np.float32))
    debugger.start()
    lib.scale(x, 2.0)
    debugger.stop()
    ms.mint.exp(x)  # between stop and start: not recorded
    debugger.start()
    ms.mint.abs(x)
    debugger.restore_custom_api(lib, "scale")
    lib.scale(x, 3.0)
    debugger.stop()
    debugger.step()
    keys = list(reader(tmp_path).keys())
    # the mul inside the recorded scale is not recorded again; after restore, scale is plain Python
    assert keys == ["MyLib.scale.0.forward", "Mint.abs.0.forward", "Tensor.__mul__.0.forward"]
    assert reader(tmp_path)["Tensor.__mul__.0.forward"]["input_args"][1] == {"type": "float", "value": 3.0}
    assert reader(tmp_path)["MyLib.scale.0.forward"]["output"][0]["Max"] == 2.0
    with pytest.raises(ConfigError, match="api_prefix"):
        debugger.register_custom_api(lib, "scale", "")


def _api_attrs():
    import mindspore.mint as mint
    from mindspore.communication import comm_func
    return (mint.abs, ms.ops.relu, ms.Tensor.__add__, comm_func.all_reduce, mint.distributed.all_gather)


def _originals():
    """The APIs unwrapped (a debugger of an earlier test, never closed, may have left its idle wrappers)."""
    return tuple(getattr(f, "__msprobe_original__", f) for f in _api_attrs())


def test_apis_are_restored_when_no_dumped_step_follows(tmp_path):
    """The wrappers stay, idle, from start() through the dumped steps, and are removed by the step()
    that ends the last of them, and by close()."""
    before = _originals()
    x = ms.Tensor(np.array([-1.0, 2.0], np.float32))
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "a"), level="L1", step=[0, 1])
    debugger.start()
    assert all(a is not b for a, b in zip(_api_attrs(), before))  # collectives too (Distributed, MintDistributed)
    debugger.stop()
    ms.mint.exp(x)  # idle between stop() and step(): not recorded
    debugger.step()
    assert all(a is not b for a, b in zip(_api_attrs(), before))  # step 1 is dumped: they stay
    ms.mint.exp(x)  # nor between step() and start()
    debugger.start()
    ms.mint.abs(x)
    debugger.stop()
    debugger.step()
    assert _api_attrs() == before  # step 2 is not dumped
    assert "__add__" not in vars(ms.Tensor)  # the C++ base's operator is visible again
    assert not (tmp_path / "a" / "step0").exists()  # nothing recorded in step 0
    assert list(reader(tmp_path / "a", step=1).keys()) == ["Mint.abs.0.forward"]

    unfiltered = PrecisionDebugger(dump_path=str(tmp_path / "b"), level="L1")
    unfiltered.start()
    unfiltered.stop()
    unfiltered.step()
    assert all(a is not b for a, b in zip(_api_attrs(), before))
    unfiltered.close()
    assert _api_attrs() == before


def test_a_second_debugger_takes_over_idle_wrappers(tmp_path):
    x = ms.Tensor(np.array([-1.0, 2.0], np.float32))
    before = _originals()
    first = PrecisionDebugger(dump_path=str(tmp_path / "first"), level="L1")
    second = PrecisionDebugger(dump_path=str(tmp_path / "second"), level="L1")
    for step in range(2):
        for debugger in (first, second):
            debugger.start()
            ms.mint.abs(x)
            debugger.stop()
            debugger.step()
    first.close()
    second.close()
    assert _api_attrs() == before
    for name in ("first", "second"):
        for step in range(2):
            assert list(reader(tmp_path / name, step=step).keys()) == ["Mint.abs.0.forward"]


def test_bad_input_gives_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="config field 'level': got 'L3'"):
        PrecisionDebugger(dump_path=str(tmp_path), level="L3")
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    with pytest.raises(ConfigError, match="'model'"):
        debugger.start()
    with pytest.raises(ConfigError, match="'model'"):
        debugger.start(model="not a cell")
    with pytest.raises(ConfigError, match="'level'"):
        PrecisionDebugger(dump_path=str(tmp_path), level="L1").save(ms.Tensor([1.0]), "x")
    with pytest.raises(ConfigError, match="'token_range'"):
        PrecisionDebugger(dump_path=str(tmp_path), level="L1").start(ms.nn.ReLU(), token_range=[3, 1])
    for err in (ConfigError,):
        assert issubclass(err, MsprobeError)


# -- seed_all -------------------------------------------------------------------------------------------
def test_seed_all_reproduces_weights_and_random_ops():
    import random
    def draw():
        return (random.random(), np.random.rand(), ms.ops.standard_normal((3,)).asnumpy(),
                ms.mint.nn.Linear(3, 2).weight.asnumpy())
    seed_all(7)
    a = draw()
    seed_all(7)
    b = draw()
    assert a[0] == b[0] and a[1] == b[1]
    np.testing.assert_array_equal(a[2], b[2])
    np.testing.assert_array_equal(a[3], b[3])
    assert os.environ["PYTHONHASHSEED"] == "7"
    with pytest.raises(ConfigError, match="'seed'"):
        seed_all(-1)


def test_seed_all_rm_dropout_and_deterministic_mode():
    from msprobe.mindspore.seed import restore_dropout
    x = ms.Tensor(np.ones((4, 64), np.float32))
    try:
        seed_all(1, mode=True, rm_dropout=True)
        assert ms.get_context("deterministic") == "ON"
        seed_all(1, mode=True)  # a second call is fine
        np.testing.assert_array_equal(ms.mint.nn.functional.dropout(x, p=0.5, training=True).asnumpy(), x.asnumpy())
        cell = ms.mint.nn.Dropout(p=0.5)
        cell.set_train(True)
        np.testing.assert_array_equal(cell(x).asnumpy(), x.asnumpy())
        prim_out = ms.ops.Dropout(keep_prob=0.5)(x)[0]
        np.testing.assert_array_equal(prim_out.asnumpy(), x.asnumpy())
    finally:
        restore_dropout()  # (MindSpore cannot switch deterministic mode off again in a process)
    assert (ms.ops.Dropout(keep_prob=0.5)(x)[0].asnumpy() == 0).any()  # restored: dropout drops again
    assert ms.mint.nn.Dropout(p=0.5).p == 0.5


@pytest.mark.parametrize("listed", [None, ["Mint.abs", "Mint.neg"]], ids=["all", "list"])
def test_in_place_call_refreshes_cached_statistics(tmp_path, listed):
    """Statistics are cached per tensor object; an in-place API must not leave the old values behind,
    recorded or not (`list` leaves the __setitem__ out: it still changes the tensor the next record reads)."""
    block = {"list": listed} if listed else {}
    debugger = PrecisionDebugger(config_path=write_config(tmp_path, level="L1", block=block))
    x = ms.Tensor(np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32))
    debugger.start()
    y = ms.mint.abs(x)
    y[0] = 10.0
    ms.mint.neg(y)
    debugger.stop()
    debugger.step()
    r = reader(tmp_path / "dump")
    setitem = [] if listed else ["Tensor.__setitem__.0.forward"]
    assert list(r.keys()) == ["Mint.abs.0.forward", *setitem, "Mint.neg.0.forward"]
    assert r["Mint.abs.0.forward"]["output"][0]["Max"] == 4.0
    if not listed:
        assert r["Tensor.__setitem__.0.forward"]["input_args"][0]["Max"] == 4.0
        assert r["Tensor.__setitem__.0.forward"]["output"][0]["Max"] == 10.0  # the changed tensor
    assert r["Mint.neg.0.forward"]["input_args"][0]["Max"] == 10.0


def test_cell_hooks_stay_idle_between_dumped_steps_and_go_after_the_last(tmp_path):
    """L0's Cell hooks are registered once for a run of dumped steps: a forward between stop() and the
    next start() is not recorded, and the step() ending the last dumped step removes them."""
    from mindspore import nn

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(2, 2)

        def construct(self, x):
            return self.fc(x)

    net = Net()
    x = ms.Tensor(np.array([[1.0, -2.0]], np.float32))
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="L0", step=[0, 1])
    for step in range(2):
        debugger.start(net)
        net(x)
        debugger.stop()
        net(x)  # idle between stop() and step()
        debugger.step()
        assert bool(net.fc._forward_pre_hook) == (step == 0)  # step 1 is the last dumped step
        net(x)  # idle between step() and start()
    for step in range(2):
        keys = list(reader(tmp_path, step=step).keys())
        assert keys == ["Cell.fc.Dense.forward.0"], keys
    debugger.close()

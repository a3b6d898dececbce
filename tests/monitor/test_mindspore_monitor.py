"""TrainerMon on a real MindSpore (PyNative, CPU) training loop with nn.Adam: gradients, Adam moments,
parameters and Cell activations are checked against the tensors the test reads itself, and a planted
gradient blow-up raises the alert at its step."""

import json

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from msprobe.core.monitor.ops import stats_from_array  # noqa: E402
from msprobe.core.monitor.reader import load_monitor_dir  # noqa: E402
from msprobe.mindspore import TrainerMon  # noqa: E402
from mindspore import nn  # noqa: E402

OPS = ["norm", "min", "max", "mean", "nans", "zeros"]


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 12)
        self.act = nn.Tanh()
        self.fc2 = nn.Dense(12, 3)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


def oracle(t):
    return stats_from_array(t.asnumpy() if hasattr(t, "asnumpy") else t, OPS, 1e-8)


def value(df, tag, name, step, micro=0):
    sel = df[(df["tag"] == tag) & (df["name"] == name) & (df["step"] == step) & (df["micro_step"] == micro)]
    assert len(sel) == 1, (tag, name, step, sel)
    return [float(sel.iloc[0][op]) for op in OPS]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ms_monitor")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    cfg = tmp / "monitor.json"
    cfg.write_text(json.dumps({"xy_distribution": True, "wg_distribution": True, "mv_distribution": True,
                               "param_distribution": True, "ops": OPS,
                               "alert": {"rules": [{"rule_name": "AnomalyTurbulence", "args": {"threshold": 1.0}}],
                                         "dump": True}}))
    import os
    os.environ["MONITOR_OUTPUT_DIR"] = str(tmp / "out")
    try:
        net = Net()
        opt = nn.Adam(net.trainable_params(), learning_rate=1e-3)
        mon = TrainerMon(str(cfg))
        mon.set_monitor(net, grad_acc_steps=1, optimizer=opt)
        seen = {}
        net.fc2.register_forward_hook(lambda c, i, o: seen.setdefault("fc2.output", []).append(oracle(o)))
        loss_fn = nn.MSELoss()
        grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
        rng = np.random.default_rng(0)
        x = ms.Tensor(rng.standard_normal((8, 6)).astype(np.float32))
        y = ms.Tensor(rng.standard_normal((8, 3)).astype(np.float32))
        record = []
        for step in range(5):
            before = {p.name: oracle(p) for p in opt.parameters}
            _, grads = grad_fn(x, y)
            backward = {p.name: oracle(g) for p, g in zip(opt.parameters, grads)}
            if step == 3:
                grads = tuple(g * 1000.0 for g in grads)      # planted blow-up, after backward
            opt(grads)
            record.append({"before": before, "grads": {p.name: oracle(g) for p, g in zip(opt.parameters, grads)},
                           "backward": backward,
                           "m1": {p.name: oracle(m) for p, m in zip(opt.parameters, opt.moment1)},
                           "m2": {p.name: oracle(m) for p, m in zip(opt.parameters, opt.moment2)},
                           "after": {p.name: oracle(p) for p in opt.parameters}})
        mon.close()
    finally:
        os.environ.pop("MONITOR_OUTPUT_DIR", None)
    return tmp / "out", mon, record, seen


def test_adam_moments_grads_and_params(run):
    out, _, record, _ = run
    df = load_monitor_dir(str(out))
    assert set(df["tag"]) == {"actv", "actv_grad", "grad_unreduced", "grad_reduced", "exp_avg", "exp_avg_sq",
                              "param_origin", "param_updated"}
    for step, rec in enumerate(record):
        for name in rec["grads"]:
            for tag, key in (("grad_unreduced", "backward"), ("grad_reduced", "grads"), ("exp_avg", "m1"),
                             ("exp_avg_sq", "m2"),
                             ("param_origin", "before"), ("param_updated", "after")):
                assert np.allclose(value(df, tag, name, step), rec[key][name], rtol=1e-5, atol=1e-7), (tag, name, step)


def test_cell_activations_and_gradients(run):
    out, _, _, seen = run
    df = load_monitor_dir(str(out))
    for step, want in enumerate(seen["fc2.output"]):
        assert np.allclose(value(df, "actv", "fc2.output", step), want, rtol=1e-5, atol=1e-7)
    names = set(df[df["tag"] == "actv_grad"]["name"])
    assert {"fc2.output", "fc2.input", "act.output", "act.input", "fc1.output"} <= names
    # the gradient flowing into act's output is the one leaving fc2's input
    assert np.allclose(value(df, "actv_grad", "act.output", 0), value(df, "actv_grad", "fc2.input", 0))
    assert df[df["tag"] == "actv"]["dtype"].iloc[0] == "Float32"


def test_planted_blowup_alert(run):
    out, mon, _, _ = run
    kinds = {(a["step"], a["tag_name"].split("/")[-1]) for a in mon.anomalies}
    # before the blow-up only Adam's second moment trips the rule: it grows from zero in the first steps
    assert {tag for step, tag in kinds if step < 3} <= {"exp_avg_sq"}
    assert min(step for step, tag in kinds if tag == "grad_reduced") == 3
    tags = {a["tag_name"] for a in mon.anomalies if a["step"] == 3}
    assert "0:fc1.weight/rank0/grad_reduced" in tags
    # the blow-up was applied after backward: the gradients backward computed stayed quiet
    assert not any(t.endswith("/grad_unreduced") for t in tags)
    assert json.load(open(out / "anomaly_detected" / "anomaly_0.json"))


def test_grad_accumulation_sums_the_backward_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    ms.set_seed(1)
    net = Net()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    cfg = tmp_path / "monitor.json"
    cfg.write_text(json.dumps({"wg_distribution": True, "xy_distribution": True, "forward_only": True,
                               "ops": OPS}))
    mon = TrainerMon(str(cfg))
    mon.set_monitor(net, grad_acc_steps=2, optimizer=opt)
    grad_fn = ms.value_and_grad(lambda x: net(x).sum(), None, opt.parameters)
    rng = np.random.default_rng(1)
    xs = [ms.Tensor(rng.standard_normal((4, 6)).astype(np.float32)) for _ in range(2)]
    parts = [grad_fn(x)[1] for x in xs]
    summed = tuple(a + b for a, b in zip(*parts))
    opt(summed)
    mon.close()
    df = load_monitor_dir(str(tmp_path / "out"))
    for p, g in zip(opt.parameters, summed):
        assert np.allclose(value(df, "grad_unreduced", p.name, 0), oracle(g), rtol=1e-5, atol=1e-6)
        assert np.allclose(value(df, "grad_reduced", p.name, 0), oracle(g), rtol=1e-5, atol=1e-6)
    assert sorted(df[(df["tag"] == "actv") & (df["name"] == "fc1.output")]["micro_step"]) == [0, 1]


def test_print_struct_writes_cells_and_stops(tmp_path, monkeypatch):
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    net = Net()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    cfg = tmp_path / "monitor.json"
    cfg.write_text(json.dumps({"print_struct": True, "xy_distribution": True}))
    mon = TrainerMon(str(cfg))
    mon.set_monitor(net, grad_acc_steps=1, optimizer=opt)
    grads = ms.value_and_grad(lambda x: net(x).sum(), None, opt.parameters)(ms.Tensor(np.ones((2, 6), np.float32)))[1]
    with pytest.raises(SystemExit):
        opt(grads)
    struct = json.load(open(tmp_path / "out" / "module_struct" / "rank0" / "module_struct.json"))
    assert set(struct) == {"", "fc1", "act", "fc2"} and struct["fc2"]["type"] == "Dense"
    assert struct["fc1"]["input"] == "tensor" and struct["fc1"]["output"] == "tensor"


def test_a_closed_monitor_keeps_nothing_alive(tmp_path, monkeypatch):
    """close() removes its exit hook too, which kept the monitor and the network alive until exit.
    (Not with xy_distribution: MindSpore 2.10 keeps a Cell's backward-hook primitive, and the Cell
    with it, after the hook's handle is removed.)"""
    import gc
    import weakref

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    cfg = tmp_path / "monitor.json"
    cfg.write_text(json.dumps({"wg_distribution": True, "param_distribution": True}))
    net = Net()
    opt = nn.SGD(net.trainable_params(), learning_rate=1e-3)
    mon = TrainerMon(str(cfg))
    mon.set_monitor(net, grad_acc_steps=1, optimizer=opt)
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    x, y = ms.Tensor(np.ones((4, 6), np.float32)), ms.Tensor(np.zeros((4, 3), np.float32))
    for _ in range(2):
        _, grads = grad_fn(x, y)
        opt(grads)
    mon.close()
    refs = [weakref.ref(net), weakref.ref(mon)]
    del net, opt, mon, grad_fn, loss_fn, grads
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_a_wrapped_optimizer_is_found_and_a_non_optimizer_refused_in_one_line(tmp_path, monkeypatch):
    from msprobe.core.errors import MsprobeError

    class Wrapper:  # a training library's wrapper: the real optimizer in .optimizer
        def __init__(self, inner):
            self.optimizer = inner

    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(tmp_path / "out"))
    cfg = tmp_path / "monitor.json"
    cfg.write_text(json.dumps({"wg_distribution": True}))
    net = Net()
    opt = nn.SGD(net.trainable_params(), learning_rate=1e-3)
    mon = TrainerMon(str(cfg))
    mon.set_monitor(net, grad_acc_steps=1, optimizer=Wrapper(Wrapper(opt)))
    assert mon.optimizer is opt
    mon.close()
    with pytest.raises(MsprobeError, match=r"optimizer Wrapper is not a mindspore.nn.Optimizer .*pass the nn optimizer") as e:
        TrainerMon(str(cfg)).set_monitor(net, grad_acc_steps=1, optimizer=Wrapper(object()))
    assert "\n" not in str(e.value)

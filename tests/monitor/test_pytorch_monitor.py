"""TrainerMon on real PyTorch training runs: every value in the CSVs is checked against numbers the test
computes itself from the model's own tensors (gradients before `optimizer.step()`, optimizer state,
parameters, module outputs), plus the planted-blow-up alert, the msProbe CSV layout, gradient
accumulation, TensorBoard output, targets, step selection, print_struct and wrapped optimizers."""

from pathlib import Path
import glob
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from msprobe.core.errors import ConfigError, MsprobeError  # noqa: E402
from msprobe.core.monitor.ops import stats_from_array  # noqa: E402
from msprobe.core.monitor.reader import load_monitor_dir  # noqa: E402
from msprobe.pytorch import TrainerMon  # noqa: E402

SAMPLES = str(Path(__file__).resolve().parents[1] / "data" / "msprobe-samples/monitor")
ALL_OPS = ["norm", "min", "max", "mean", "nans", "zeros"]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 12)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(12, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


@pytest.fixture
def out_dir(tmp_path, monkeypatch):
    out = tmp_path / "monitor_output"
    monkeypatch.setenv("MONITOR_OUTPUT_DIR", str(out))
    return out


def write_config(tmp_path, **fields):
    path = tmp_path / "monitor_config.json"
    path.write_text(json.dumps(fields))
    return str(path)


def oracle(t, ops=ALL_OPS):
    return stats_from_array(t.detach().float().numpy(), ops, 1e-8)


def rows(df, tag, step=None):
    sel = df[df["tag"] == tag]
    return sel if step is None else sel[sel["step"] == step]


def value(df, tag, name, step, op, micro=0):
    sel = rows(df, tag, step)
    sel = sel[(sel["name"] == name) & (sel["micro_step"] == micro)]
    assert len(sel) == 1, (tag, name, step, micro, sel)
    return float(sel.iloc[0][op])


# -- planted gradient blow-up -------------------------------------------------------------------------
def train_with_blowup(tmp_path, out_dir, fmt="csv", steps=8, blowup_step=5):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    cfg = write_config(tmp_path, wg_distribution=True, xy_distribution=True, ops=["norm", "max", "nans"],
                       format=fmt, alert={"rules": [{"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}},
                                                    {"rule_name": "AnomalyNan", "args": {"threshold": 1e10}}],
                                          "dump": True})
    mon = TrainerMon(cfg)
    mon.set_monitor(model, grad_acc_steps=1, optimizer=opt)
    x, y = torch.randn(16, 6), torch.randn(16, 3)
    losses, grad_norms = [], []
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        (loss * (1e3 if step == blowup_step else 1.0)).backward()   # the planted blow-up
        grad_norms.append({n: p.grad.norm().item() for n, p in model.named_parameters()})
        opt.step()
    mon.close()
    return mon, losses, grad_norms


def test_planted_blowup_raises_alert_at_that_step(tmp_path, out_dir):
    mon, losses, grad_norms = train_with_blowup(tmp_path, out_dir)
    assert losses[6] > 20 * losses[5]                          # the loss spikes after the blown-up update
    steps = sorted({a["step"] for a in mon.anomalies})
    assert steps and steps[0] == 5                            # nothing before the blow-up, alert at it
    at5 = {(a["tag_name"].split("/")[-1], a["tag_name"].split("/")[0]) for a in mon.anomalies if a["step"] == 5}
    for name in ("fc1.weight", "fc2.weight", "fc2.bias"):
        assert ("grad_reduced", f"0:{name}") in at5 and ("grad_unreduced", f"0:{name}") in at5
    # the anomaly JSON on disk holds the same records, in msProbe's field layout
    files = glob.glob(str(out_dir / "anomaly_detected" / "anomaly_0.json"))
    assert len(files) == 1
    on_disk = json.load(open(files[0]))
    assert len(on_disk) == len(mon.anomalies)
    rec = next(r for r in on_disk.values() if r["tag_name"] == "0:fc1.weight/rank0/grad_reduced" and r["step"] == 5)
    assert {"rank", "step", "micro_step", "pp_stage", "vpp_stage", "call_id", "tag_name", "message",
            "group_mates"} <= set(rec)
    assert rec["rule"] == "AnomalyTurbulence" and rec["op"] in ("norm", "max") and rec["rank"] == 0
    assert "step 5" in rec["message"] and rec["value"] > 10 * rec["recent_max"]
    # and the recorded gradient norms are the ones the optimizer saw, at every step
    df = load_monitor_dir(str(out_dir))
    for step, norms in enumerate(grad_norms):
        for name, norm in norms.items():
            assert value(df, "grad_reduced", name, step, "norm") == pytest.approx(norm, rel=1e-5)
            assert value(df, "grad_unreduced", name, step, "norm") == pytest.approx(norm, rel=1e-5)


def test_nan_input_raises_anomaly_nan(tmp_path, out_dir):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = TrainerMon(write_config(tmp_path, xy_distribution=True, forward_only=True, ops=["norm", "nans"],
                                  alert={"rules": [{"rule_name": "AnomalyNan"}], "dump": True}))
    mon.set_monitor(model, 1, opt)
    for step in range(3):
        x = torch.randn(4, 6)
        if step == 2:
            x[1, 3] = float("nan")
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    hits = {(a["step"], a["tag_name"].split(":")[1], a["op"]) for a in mon.anomalies}
    assert {s for s, _, _ in hits} == {2}
    assert (2, "fc1.input", "nans") in hits and (2, "fc1.output", "nans") in hits
    df = load_monitor_dir(str(out_dir))
    assert value(df, "actv", "fc1.input", 2, "nans") == 1.0
    assert value(df, "actv", "fc1.output", 2, "nans") == 12.0       # one NaN row spreads to all 12 outputs


# -- optimizer moments and parameters ------------------------------------------------------------------
@pytest.mark.parametrize("make_opt, keys", [
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), {"momentum_buffer"}),
    (lambda ps: torch.optim.Adam(ps, lr=1e-2), {"exp_avg", "exp_avg_sq"}),
    (lambda ps: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True), {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}),
], ids=["SGD", "Adam", "AdamW-amsgrad"])
def test_optimizer_moments_and_params(tmp_path, out_dir, make_opt, keys):
    torch.manual_seed(1)
    model = Net()
    opt = make_opt(model.parameters())
    mon = TrainerMon(write_config(tmp_path, mv_distribution=True, param_distribution=True, ops=ALL_OPS))
    mon.set_monitor(model, 1, opt)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    before, state = [], []
    for _ in range(3):
        before.append({n: oracle(p) for n, p in model.named_parameters()})
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        state.append({(k, n): oracle(opt.state[p][k]) for n, p in model.named_parameters() for k in keys})
    mon.close()
    df = load_monitor_dir(str(out_dir))
    assert set(df["tag"]) == keys | {"param_origin", "param_updated"}
    for step in range(3):
        for (key, name), want in state[step].items():
            got = [value(df, key, name, step, op) for op in ALL_OPS]
            assert np.allclose(got, want, rtol=1e-4, atol=1e-6), (key, name, step, got, want)
        for name, want in before[step].items():
            got = [value(df, "param_origin", name, step, op) for op in ALL_OPS]
            assert np.allclose(got, want, rtol=1e-4, atol=1e-6)
    for name, p in model.named_parameters():   # after the last step
        assert np.allclose([value(df, "param_updated", name, 2, op) for op in ALL_OPS], oracle(p), rtol=1e-4,
                           atol=1e-6)


class LibraryOptimizerWrapper:
    """The shape training libraries give their wrappers (Accelerate, DeepSpeed, Megatron): the torch
    optimizer sits in `.optimizer` and `step()` delegates to it."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def step(self):
        self.optimizer.step()

    def zero_grad(self):
        self.optimizer.zero_grad()


def test_wrapped_optimizer_is_unwrapped(tmp_path, out_dir):
    torch.manual_seed(2)
    model = Net()
    inner = torch.optim.Adam(model.parameters(), lr=1e-2)
    wrapped = LibraryOptimizerWrapper(LibraryOptimizerWrapper(inner))
    mon = TrainerMon(write_config(tmp_path, mv_distribution=True, wg_distribution=True))
    mon.set_monitor(model, 1, wrapped)
    model(torch.randn(3, 6)).sum().backward()
    wrapped.step()
    mon.close()
    df = load_monitor_dir(str(out_dir))
    assert value(df, "exp_avg", "fc2.bias", 0, "norm") == pytest.approx(inner.state[model.fc2.bias]["exp_avg"].norm().item(),
                                                                         rel=1e-5)
    with pytest.raises(MsprobeError, match="not a torch.optim.Optimizer"):
        TrainerMon(write_config(tmp_path, wg_distribution=True)).set_monitor(model, 1, object())


# -- activations ---------------------------------------------------------------------------------------
def test_activations_and_their_gradients_match_the_modules(tmp_path, out_dir):
    torch.manual_seed(3)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = TrainerMon(write_config(tmp_path, xy_distribution=True, ops=ALL_OPS))
    mon.set_monitor(model, 1, opt)
    seen = {}
    handles = []
    for name in ("fc1", "act", "fc2"):
        mod = getattr(model, name)
        handles.append(mod.register_forward_hook(
            lambda m, a, o, name=name: seen.update({f"{name}.input": oracle(a[0]), f"{name}.output": oracle(o)})))
        handles.append(mod.register_full_backward_hook(
            lambda m, gi, go, name=name: seen.update({f"grad {name}.output": oracle(go[0])})))
    x = torch.randn(5, 6)
    model(x).pow(2).sum().backward()
    opt.step()
    mon.close()
    df = load_monitor_dir(str(out_dir))
    for key, want in seen.items():
        tag, name = ("actv_grad", key[5:]) if key.startswith("grad ") else ("actv", key)
        got = [value(df, tag, name, 0, op) for op in ALL_OPS]
        assert np.allclose(got, want, rtol=1e-5, atol=1e-6), (key, got, want)
    # the root module is named "" as in msProbe (".input", ".output"); its int-free input has no gradient
    assert value(df, "actv", ".output", 0, "norm") == pytest.approx(seen["fc2.output"][0], rel=1e-5)
    assert ".input" not in set(rows(df, "actv_grad")["name"])


def test_csv_layout_matches_msprobe_samples(tmp_path, out_dir):
    torch.manual_seed(4)
    model = Net()
    opt = torch.optim.Adam(model.parameters())
    cfg = json.load(open(f"{SAMPLES}/monitor_config_full.json"))
    mon = TrainerMon(write_config(tmp_path, **cfg))
    mon.set_monitor(model, 1, opt)
    for _ in range(2):
        model(torch.randn(2, 6)).sum().backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    (rank_dir,) = [d for d in out_dir.iterdir() if d.name != "anomaly_detected"]
    assert rank_dir.name.split("-")[-2] == "rank0"
    ours = sorted(f.name for f in rank_dir.iterdir())
    theirs = sorted(os.path.basename(f) for f in glob.glob(f"{SAMPLES}/*_1-1.csv"))
    assert [f for f in ours if f.endswith("_1-1.csv")] == theirs
    for name in theirs:
        with open(f"{SAMPLES}/{name}") as a, open(rank_dir / name) as b:
            assert a.readline() == b.readline(), name               # identical header
    line = (rank_dir / "grad_reduced_1-1.csv").read_text().splitlines()[1].split(",")
    assert line[0] == "0" and line[2] == "1" and line[-1] == "torch.float32"


def test_gradient_accumulation_micro_steps(tmp_path, out_dir):
    torch.manual_seed(5)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = TrainerMon(write_config(tmp_path, xy_distribution=True, wg_distribution=True, ops=["norm"]))
    mon.set_monitor(model, grad_acc_steps=2, optimizer=opt)
    xs = [torch.randn(3, 6), torch.randn(3, 6) * 5]
    outs = []
    for x in xs:
        out = model(x)
        outs.append(out.norm().item())
        out.sum().backward()
    acc = model.fc1.weight.grad.norm().item()
    opt.step()
    mon.close()
    df = load_monitor_dir(str(out_dir))
    assert [value(df, "actv", "fc2.output", 0, "norm", micro=m) for m in (0, 1)] == pytest.approx(outs, rel=1e-5)
    unreduced = rows(df, "grad_unreduced", 0)
    assert list(unreduced["name"]).count("fc1.weight") == 1          # once, after the last micro batch
    assert value(df, "grad_unreduced", "fc1.weight", 0, "norm") == pytest.approx(acc, rel=1e-5)


def test_tensorboard_output(tmp_path, out_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, _, grad_norms = train_with_blowup(tmp_path, out_dir, fmt="tensorboard", steps=3)
    (rank_dir,) = [d for d in out_dir.iterdir() if d.name != "anomaly_detected"]
    assert not list(rank_dir.glob("*.csv")) and list(rank_dir.glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(rank_dir), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"0:fc1.weight/rank0/grad_reduced_norm", "0:fc1.output:0/rank0/actv_norm",
            "0:fc2.output:0/rank0/actv_grad_max", "0:fc1.input:0/rank0/actv_nans"} <= tags
    got = [(e.step, e.value) for e in acc.Scalars("0:fc2.weight/rank0/grad_reduced_norm")]
    assert [s for s, _ in got] == [0, 1, 2]
    assert [v for _, v in got] == pytest.approx([g["fc2.weight"] for g in grad_norms], rel=1e-5)


# -- selection -----------------------------------------------------------------------------------------
def test_targets_step_selection_and_module_ranks(tmp_path, out_dir):
    torch.manual_seed(6)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = TrainerMon(write_config(tmp_path, targets={"fc2": {}}, xy_distribution=True, backward_only=True,
                                  wg_distribution=True, start_step=1, step_interval=2, collect_times=2))
    mon.set_monitor(model, 1, opt)
    for _ in range(7):
        model(torch.randn(2, 6)).sum().backward()
        opt.step()
        opt.zero_grad()
    mon.close()
    df = load_monitor_dir(str(out_dir))
    assert sorted(df["step"].unique()) == [1, 3]
    assert set(df["tag"]) == {"actv_grad", "grad_unreduced", "grad_reduced"}      # backward_only
    assert set(rows(df, "actv_grad")["name"]) == {"fc2.input", "fc2.output"}
    assert set(rows(df, "grad_reduced")["name"]) == {"fc2.weight", "fc2.bias"}

    out2 = tmp_path / "other_rank"
    os.environ["MONITOR_OUTPUT_DIR"] = str(out2)
    mon = TrainerMon(write_config(tmp_path, xy_distribution=True, wg_distribution=True, module_ranks=[1]))
    mon.set_monitor(model, 1, opt)                                  # this process is rank 0
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    mon.close()
    assert set(load_monitor_dir(str(out2))["tag"]) == {"grad_unreduced", "grad_reduced"}


def test_tuple_target_spec_selects_one_element(tmp_path, out_dir):
    class Pair(nn.Module):
        def forward(self, a, b):
            return a * 2, b + 1

    class Top(nn.Module):
        def __init__(self):
            super().__init__()
            self.pair = Pair()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            a, b = self.pair(x, x * 10)
            return self.fc(a + b)

    model = Top()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = TrainerMon(write_config(tmp_path, targets={"pair": {"input": "tuple[2]:1", "output": "tuple[2]:0"}},
                                  xy_distribution=True, forward_only=True, ops=["max"]))
    mon.set_monitor(model, 1, opt)
    x = torch.tensor([[1.0, 2.0]])
    model(x).sum().backward()
    opt.step()
    mon.close()
    df = load_monitor_dir(str(out_dir))
    assert dict(zip(df["name"], df["max"])) == {"pair.input": 20.0, "pair.output": 4.0}


def test_print_struct_writes_structure_and_stops(tmp_path, out_dir):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = TrainerMon(write_config(tmp_path, print_struct=True, xy_distribution=True))
    mon.set_monitor(model, 1, opt)
    model(torch.randn(2, 6)).sum().backward()
    with pytest.raises(SystemExit):
        opt.step()
    struct = json.load(open(out_dir / "module_struct" / "rank0" / "module_struct.json"))
    assert set(struct) == {"", "fc1", "act", "fc2"}
    assert struct["fc1"]["type"] == "Linear" and struct["fc1"]["input"] == "tensor"
    assert not opt._optimizer_step_pre_hooks                        # hooks removed


def test_api_format_and_bad_arguments(tmp_path, out_dir):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = TrainerMon(write_config(tmp_path, format="api", wg_distribution=True, xy_distribution=True))
    with pytest.raises(MsprobeError, match="grad_acc_steps 0 is not allowed"):
        mon.set_monitor(model, 0, opt)
    mon.set_monitor(model, 1, opt)
    model(torch.randn(2, 6)).sum().backward()
    g = model.fc2.bias.grad.norm().item()
    opt.step()
    reduced, unreduced = mon.generate_wgrad_metrics()
    actv, _ = mon.generate_xy_metrics()
    mon.close()
    assert reduced["fc2.bias"]["norm"] == pytest.approx(g, rel=1e-6) == unreduced["fc2.bias"]["norm"]
    assert "fc1.output" in actv
    assert not out_dir.exists() or not list(out_dir.glob("*/*.csv"))   # api: nothing on disk
    with pytest.raises(ConfigError, match="config field 'ops'"):
        TrainerMon(write_config(tmp_path, ops=["norm", "median"]))


def test_clipping_and_edited_params_are_seen(tmp_path, out_dir):
    """grad_unreduced is the gradient as backward left it, grad_reduced what the optimizer got after
    clip_grad_norm_; param_origin sees a parameter edited between steps (no stale reuse)."""
    torch.manual_seed(7)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = TrainerMon(write_config(tmp_path, wg_distribution=True, param_distribution=True, ops=["norm"]))
    mon.set_monitor(model, 1, opt)
    raw_norms, clipped, edited = [], [], None
    for step in range(2):
        (model(torch.randn(4, 6)) * 50).sum().backward()
        raw_norms.append(model.fc1.weight.grad.norm().item())
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.01)
        clipped.append(model.fc1.weight.grad.norm().item())
        opt.step()
        opt.zero_grad()
        if step == 0:
            with torch.no_grad():
                model.fc2.weight.mul_(3.0)
            edited = model.fc2.weight.norm().item()
    mon.close()
    df = load_monitor_dir(str(out_dir))
    for step in range(2):
        assert value(df, "grad_unreduced", "fc1.weight", step, "norm") == pytest.approx(raw_norms[step], rel=1e-5)
        assert value(df, "grad_reduced", "fc1.weight", step, "norm") == pytest.approx(clipped[step], rel=1e-5)
        assert raw_norms[step] > 10 * clipped[step]
    assert value(df, "param_origin", "fc2.weight", 1, "norm") == pytest.approx(edited, rel=1e-5)
    assert value(df, "param_origin", "fc2.weight", 1, "norm") == pytest.approx(
        3 * value(df, "param_updated", "fc2.weight", 0, "norm"), rel=1e-5)


def test_a_closed_monitor_keeps_nothing_alive(tmp_path, out_dir):
    """close() removes its exit hook too: it used to keep the monitor, and with it the model and the
    optimizer, alive until the interpreter exits."""
    import gc
    import weakref

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = TrainerMon(write_config(tmp_path, wg_distribution=True, xy_distribution=True))
    mon.set_monitor(model, grad_acc_steps=1, optimizer=opt)
    for _ in range(2):
        opt.zero_grad()
        nn.functional.mse_loss(model(torch.randn(4, 6)), torch.randn(4, 3)).backward()
        opt.step()
    mon.close()
    mon.close()  # twice is fine
    refs = [weakref.ref(o) for o in (model, opt, mon)]
    del model, opt, mon
    gc.collect()
    assert [r() for r in refs] == [None, None, None]

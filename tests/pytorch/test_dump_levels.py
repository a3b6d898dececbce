"""Dump filters and the other ways in: list, scope, data_mode, step, tensor_list, level debug
(`debugger.save`), token_range, start(model=[m1, m2]), register_custom_api, nested calls, start/stop
within a step. Each filtered run is checked against an unfiltered run of the same model and data."""

import os
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from msprobe.core.dump.reader import DumpReader, find_rank_dirs
from msprobe.pytorch import PrecisionDebugger
import msprobe_test_models as models  # loaded by conftest.py

PID = os.getpid()


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """Unfiltered statistics dumps, one per (model, level), to compare filtered runs against."""
    cache = {}

    def get(name, level):
        if (name, level) not in cache:
            cache[name, level] = models.run_dump(tmp_path_factory.mktemp(f"full_{name}_{level}"), name, level,
                                                 "statistics")
        return cache[name, level]
    return get


def is_backward(key):
    return key.endswith(".backward") or ".backward." in key


def is_forward(key):
    return key.endswith(".forward") or ".forward." in key


def backward_of(key):
    return key[:-len("forward")] + "backward" if key.endswith(".forward") else key.replace(".forward.", ".backward.")


def one_debugger_run(tmp_path, level, body, task="statistics", steps=1, **start_kwargs):
    """Run `body(debugger, step)` for `steps` steps; returns {step: DumpReader}."""
    dump_path = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=dump_path, level=level, task=task)
    try:
        for step in range(steps):
            body(dbg, step)
            dbg.step()
    finally:
        models.finish(dbg)
    return {r.step: DumpReader(r.path) for r in find_rank_dirs(dump_path)}


# -- list ---------------------------------------------------------------------------------------------

def test_list_substring_L1(tmp_path, full):
    ref = full("transformer", "L1")
    run = models.run_dump(tmp_path, "transformer", "L1", "statistics", list=["linear"])
    for step in (0, 1):
        keys = run.readers[step].keys()
        assert keys and all("linear" in k for k in keys)
        assert set(keys) == {k for k in ref.readers[step].keys() if "linear" in k}
        assert "Functional.linear.5.forward" in keys and "Functional.linear.0.backward" in keys
        h = run.history[step]
        models.assert_stats(run.readers[step]["Functional.linear.0.forward"]["input_args"][0], h["x"])
        models.assert_stats(run.readers[step]["Functional.linear.0.backward"]["output"][1], h["grads"]["l.weight"])


def _ancestors(construct, key):
    seen = []
    parent = construct.get(key)
    while parent:
        seen.append(parent)
        parent = construct.get(parent)
    return seen


def test_list_module_span_mix(tmp_path, full):
    """At mix a listed module name selects the module and every call inside its span, forward and
    backward (plus the parameter gradients of the modules recorded)."""
    ref = full("transformer", "mix")
    run = models.run_dump(tmp_path, "transformer", "mix", "statistics", list=["attn.Attention"])
    for step in (0, 1):
        keys = set(run.readers[step].keys())
        construct = ref.readers[step].construct
        want = {k for k in ref.readers[step].keys()
                if "attn.Attention" in k or any("attn.Attention" in a for a in _ancestors(construct, k))}
        want |= {k for k in ref.readers[step].keys() if ".parameters_grad." in k
                 and k.rsplit(".", 2)[0] + ".forward.0" in want}
        assert "Module.attn.qkv.Linear.forward.0" in want and "Torch.matmul.1.backward" in want
        assert keys == want
        assert "Functional.linear.0.forward" not in keys and "Module.l.Linear.forward.0" not in keys


# -- scope ----------------------------------------------------------------------------------------------

def test_scope_api_range_L1(tmp_path, full):
    ref = full("transformer", "L1")
    start, end = "Functional.linear.1.forward", "Functional.softmax.0.forward"
    run = models.run_dump(tmp_path, "transformer", "L1", "statistics", scope=[start, end])
    for step in (0, 1):
        order = [k for k in ref.readers[step].keys() if is_forward(k)]
        window = order[order.index(start):order.index(end) + 1]
        assert len(window) > 5
        keys = run.readers[step].keys()
        assert [k for k in keys if is_forward(k)] == window
        ref_keys = set(ref.readers[step].keys())
        assert {k for k in keys if is_backward(k)} == {backward_of(k) for k in window} & ref_keys
        assert run.readers[step]["Functional.softmax.0.forward"] == ref.readers[step]["Functional.softmax.0.forward"]


def test_scope_module_range_mix(tmp_path, full):
    """scope [module A, module B] at mix: from A's start to B's end, the calls inside B included."""
    ref = full("transformer", "mix")
    start, end = "Module.attn.Attention.forward.0", "Module.fc1.Linear.forward.0"
    run = models.run_dump(tmp_path, "transformer", "mix", "statistics", scope=[start, end])
    for step in (0, 1):
        keys = run.readers[step].keys()
        order = [k for k in ref.readers[step].keys() if is_forward(k)]
        # forward records are written when a call ends: A's first inner API comes first, B itself last
        window = order[order.index("Functional.linear.1.forward"):order.index(end) + 1]
        assert start in window and "Functional.linear.3.forward" in window  # the API inside fc1
        assert [k for k in keys if is_forward(k)] == window
        assert "Functional.gelu.0.forward" not in keys and "Module.ln1.LayerNorm.forward.0" not in keys
        ref_keys = set(ref.readers[step].keys())
        assert {k for k in keys if is_backward(k)} == {backward_of(k) for k in window} & ref_keys
        assert set(keys) <= ref_keys


# -- data_mode ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", ["L1", "mix"])
def test_data_mode_forward(tmp_path, full, level):
    ref = full("cnn", level)
    run = models.run_dump(tmp_path, "cnn", level, "statistics", data_mode=["forward"])
    for step in (0, 1):
        keys = run.readers[step].keys()
        assert keys == [k for k in ref.readers[step].keys() if is_forward(k)]
        for k in keys:
            assert run.readers[step][k] == ref.readers[step][k], k


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_data_mode_backward(tmp_path, full, level):
    ref = full("cnn", level)
    run = models.run_dump(tmp_path, "cnn", level, "statistics", data_mode=["backward"])
    for step in (0, 1):
        keys = run.readers[step].keys()
        assert keys and not any(is_forward(k) for k in keys)
        assert set(keys) == {k for k in ref.readers[step].keys() if not is_forward(k)}
        assert "Module.l.Linear.parameters_grad.0" in keys
        for k in keys:
            assert run.readers[step][k] == ref.readers[step][k], k


@pytest.mark.parametrize("mode", ["input", "output"])
def test_data_mode_input_output(tmp_path, full, mode):
    """["input"]: forward input_args and backward `input` (output grads) only; ["output"] the rest."""
    ref = full("transformer", "mix")
    run = models.run_dump(tmp_path, "transformer", "mix", "statistics", data_mode=[mode])
    for step in (0, 1):
        r, rr = run.readers[step], ref.readers[step]
        assert set(r.keys()) == set(rr.keys())
        for k in r.keys():
            rec, full_rec = r[k], rr[k]
            if ".parameters_grad." in k:
                continue
            if is_forward(k):
                if mode == "input":
                    assert rec["input_args"] == full_rec["input_args"]
                    assert rec["input_kwargs"] == full_rec["input_kwargs"]
                    assert rec["output"] == []
                else:
                    assert rec["input_args"] == [] and rec["input_kwargs"] == {}
                    assert rec["output"] == full_rec["output"]
            else:
                if mode == "input":
                    assert rec["input"] == full_rec["input"] and rec["output"] == []
                else:
                    assert rec["input"] == [] and rec["output"] == full_rec["output"]
        x = run.history[step]["x"]
        if mode == "input":
            models.assert_stats(r["Functional.linear.0.forward"]["input_args"][0], x)


# -- step -------------------------------------------------------------------------------------------------

def test_step_filter(tmp_path, full):
    ref = full("rnn", "mix")
    run = models.run_dump(tmp_path, "rnn", "mix", "statistics", common={"step": [1]})
    assert os.listdir(run.dump_path) == ["step1"]
    assert list(run.readers) == [1]
    r = run.readers[1]
    assert r.keys() == ref.readers[1].keys()
    models.assert_stats(r["Functional.linear.0.forward"]["input_args"][0], run.history[1]["x"])
    assert r["Module.l.Linear.parameters_grad.0"] == ref.readers[1]["Module.l.Linear.parameters_grad.0"]


def _msprobe_hooks(model):
    """How many hooks msprobe's L0 capture has on the model's modules and parameters."""
    n = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    return n + sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in model.parameters())


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_steps_not_dumped_run_without_module_hooks(tmp_path, level):
    """Between dumped steps and after the last one the model carries no idle hooks (they slowed every
    training step); a later dumped step installs them again and records as before."""
    model, data = models.build("cnn"), models.batches("cnn", 4)
    dbg, dump_path = models.make_debugger(tmp_path, level, "statistics", common={"step": [0, 1, 3]})
    hooks = []  # msprobe hooks on the model as each step began: left by the step before
    try:
        for i in range(5):
            hooks.append(_msprobe_hooks(model))
            models.train(model, [data[i % 4]], dbg, steps=1)
    finally:
        models.finish(dbg)
    installed = len([m for m in model.modules()][1:]) * 2  # pre and post hook on every submodule
    assert hooks[0] == 0 and hooks[1] >= installed  # step 1 is dumped too: they stayed
    assert hooks[2] == 0 and hooks[4] == 0  # step 2 and the steps after 3 are not dumped
    assert hooks[3] == 0  # step 3's start() installs them again
    readers = {r.step: DumpReader(r.path) for r in find_rank_dirs(dump_path)}
    assert sorted(readers) == [0, 1, 3]
    assert readers[3].keys() == readers[0].keys()
    assert any(k.startswith("Module.") and ".backward." in k for k in readers[3].keys())
    assert any(".parameters_grad." in k for k in readers[3].keys())


# -- tensor_list --------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", ["L1", "mix"])
def test_tensor_list_in_statistics_task(tmp_path, level):
    run = models.run_dump(tmp_path, "cnn", level, "statistics", tensor_list=["relu", "Module.l.Linear"])
    for step in (0, 1):
        r = run.readers[step]
        assert r.task == "statistics"
        assert r.dump_data_dir == os.path.abspath(os.path.join(r.rank_dir, "dump_tensor_data"))
        names = []
        for key, value in r.items():
            recs = list(models.tensor_records(value))
            selected = "relu" in key or "Module.l.Linear" in key
            for rec in recs:
                assert ("data_name" in rec) == selected, key
                if selected:
                    names.append(rec["data_name"])
                    arr = r.load_tensor(rec).array
                    assert list(arr.shape) == rec["shape"] and float(arr.max()) == rec["Max"]
        assert sorted(os.listdir(os.path.join(r.rank_dir, "dump_tensor_data"))) == sorted(names)
        assert "Functional.relu.0.forward.input.0.npy" in names
        assert "Functional.relu.0.backward.output.0.npy" in names
        if level == "mix":
            assert "Module.l.Linear.parameters_grad.0.weight.npy" in names
            pg = r["Module.l.Linear.parameters_grad.0"]["weight"][0]
            assert np.array_equal(r.load_tensor(pg).array, run.history[step]["grads"]["l.weight"].numpy())


# -- level debug: debugger.save ----------------------------------------------------------------------

@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_debug_save(tmp_path, task):
    dump_path = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=dump_path, level="debug", task=task)
    gen = torch.Generator().manual_seed(0)
    seen = []
    try:
        for step in range(2):
            w = torch.randn(4, 4, generator=gen, requires_grad=True)
            x = w * 3
            dbg.start()  # a no-op at level debug
            dbg.save(x, "x_var")
            d = {"a": x * x, "n": 3, "l": [x + 1, "s"]}
            dbg.save(d, "dict_var")
            dbg.save(x, "x_var", save_backward=False)  # second save of the name -> x_var.1.debug
            dbg.save(w * 5, "unused")  # never reached by backward: its grad record is null
            loss = (x * 2).sum() + d["a"].sum() + d["l"][0].mean()
            x.retain_grad()
            loss.backward()
            dbg.stop()
            seen.append((x.detach().clone(), d["a"].detach().clone(), x.grad.clone()))
            assert torch.allclose(x.grad, 2 + 2 * x.detach() + 1 / 16)
            dbg.step()
    finally:
        models.finish(dbg)
    dirs = find_rank_dirs(dump_path)
    assert [(r.step, r.rank, r.is_proc) for r in dirs] == [(0, PID, True), (1, PID, True)]
    for rd in dirs:
        files = set(os.listdir(rd.path))
        # as msProbe: level debug writes debug.json only, no stack.json, no construct.json
        assert files == ({"debug.json", "dump_tensor_data"} if task == "tensor" else {"debug.json"})
        raw = models.read_raw(os.path.join(rd.path, "debug.json"))
        assert raw["level"] == "debug" and raw["task"] == task and raw["framework"] == "pytorch"
        r = DumpReader(rd.path)
        x, a, gx = seen[rd.step]
        assert sorted(r.keys()) == sorted(["x_var.0.debug", "dict_var.0.debug", "x_var.1.debug", "unused.0.debug",
                                           "x_var_grad.0.debug", "dict_var_grad.0.debug", "unused_grad.0.debug"])
        models.assert_stats(r["x_var.0.debug"], x)
        assert r["x_var.0.debug"]["requires_grad"] is True
        strip = {k: v for k, v in r["x_var.0.debug"].items() if k != "data_name"}
        assert {k: v for k, v in r["x_var.1.debug"].items() if k != "data_name"} == strip
        models.assert_stats(r["x_var_grad.0.debug"], gx)
        assert r["x_var_grad.0.debug"]["requires_grad"] is False
        assert r["unused_grad.0.debug"] is None
        dv = r["dict_var.0.debug"]
        models.assert_stats(dv["a"], a)
        assert dv["n"] == {"type": "int", "value": 3}
        models.assert_stats(dv["l"][0], x + 1)
        assert dv["l"][1] == {"type": "str", "value": "s"}
        assert r["dict_var_grad.0.debug"] == {
            "a": r["dict_var_grad.0.debug"]["a"], "n": None, "l": [r["dict_var_grad.0.debug"]["l"][0], None]}
        models.assert_stats(r["dict_var_grad.0.debug"]["a"], torch.ones(4, 4))
        models.assert_stats(r["dict_var_grad.0.debug"]["l"][0], torch.full((4, 4), 1 / 16))
        if task == "tensor":
            assert r["x_var.0.debug"]["data_name"] == "x_var.0.debug.npy"
            assert np.array_equal(r.load_tensor(r["x_var.0.debug"]).array, x.numpy())
            assert np.array_equal(r.load_tensor(r["x_var_grad.0.debug"]).array, gx.numpy())
            assert np.array_equal(r.load_tensor(dv["a"]).array, a.numpy())


# -- token_range ------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", ["L1", "mix"])
def test_token_range(tmp_path, level):
    """A model run 5 times per step (decoding); token_range [1, 3] records iterations 1..3 only."""
    model = models.build("inplace").eval()
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(2, models.InPlaceNet.DIM, generator=gen) for _ in range(5)]

    def body(dbg, step):
        dbg.start(model, token_range=[1, 3])
        with torch.no_grad():
            for x in xs:
                model(x)
            torch.tanh(xs[0])  # after the last iteration, outside the range
        dbg.stop()

    readers = one_debugger_run(tmp_path, level, body, steps=2)
    assert list(readers) == [0, 1]
    for step, r in readers.items():
        keys = r.keys()
        assert [k for k in keys if k.startswith("Functional.linear.")] == \
            [f"Functional.linear.{i}.forward" for i in range(9)]  # 3 Linear x 3 iterations
        assert not any(k.startswith("Torch.tanh") for k in keys)
        assert not any(is_backward(k) for k in keys)  # no_grad: no backward records
        for i, x in enumerate(xs[1:4]):
            models.assert_stats(r[f"Functional.linear.{3 * i}.forward"]["input_args"][0], x)
        if level == "mix":
            assert [k for k in keys if k.startswith("Module.l.")] == [f"Module.l.Linear.forward.{i}" for i in range(3)]
            models.assert_stats(r["Module.l.Linear.forward.2"]["input_args"][0], xs[3])
            assert r.construct["Functional.linear.3.forward"] == "Module.l.Linear.forward.1"


def test_token_range_hooks_are_removed_at_close(tmp_path):
    model = models.build("inplace").eval()

    def body(dbg, step):
        dbg.start(model, token_range=[0, 0])
        with torch.no_grad():
            model(torch.randn(2, models.InPlaceNet.DIM))
        dbg.stop()

    one_debugger_run(tmp_path, "L1", body)
    assert not model._forward_hooks and not model._forward_pre_hooks


# -- start(model=[m1, m2]) ----------------------------------------------------------------------------

@pytest.mark.parametrize("level", ["L0", "mix"])
def test_start_with_model_list(tmp_path, level):
    m1, m2 = models.build("inplace", seed=1), models.build("inplace", seed=2)
    x, y = models.batches("inplace", 1)[0]

    def body(dbg, step):
        dbg.start([m1, m2])
        loss = F.cross_entropy(m1(x), y) + F.cross_entropy(m2(x), y)
        loss.backward()
        dbg.stop()

    r = one_debugger_run(tmp_path, level, body)[0]
    keys = r.keys()
    for i, m in enumerate((m1, m2)):
        for path, mod in m.named_modules():
            if path:
                base = f"Module.{i}.{path}.{type(mod).__name__}"
                assert f"{base}.forward.0" in keys and f"{base}.backward.0" in keys
        models.assert_stats(r[f"Module.{i}.l.Linear.forward.0"]["parameters"]["weight"], m.l.weight)
        models.assert_stats(r[f"Module.{i}.l.Linear.parameters_grad.0"]["weight"][0], m.l.weight.grad)
        models.assert_stats(r[f"Module.{i}.l.Linear.forward.0"]["input_args"][0], x)
        assert r.construct[f"Module.{i}.l.Linear.forward.0"] is None
    assert not any(k.startswith("Module.InPlaceNet") or k.startswith("Module.l.") for k in keys)
    if level == "mix":
        assert r.construct["Functional.linear.3.forward"] == "Module.1.l.Linear.forward.0"


# -- register_custom_api ------------------------------------------------------------------------------

def _custom_lib():
    lib = types.ModuleType("my_kernels")

    def scale_add(a, b, scale=2.0):
        return a * scale + torch.tanh(b)

    lib.scale_add = scale_add
    return lib, scale_add


@pytest.mark.parametrize("prefix", ["MyLib", None])
def test_register_and_restore_custom_api(tmp_path, prefix):
    lib, original = _custom_lib()
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(3, 4)
    dump_path = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=dump_path, level="L1")
    want = prefix or "my_kernels"
    try:
        dbg.register_custom_api(lib, "scale_add", prefix)
        for step in range(2):
            if step == 1:
                dbg.restore_custom_api(lib, "scale_add")
                assert lib.scale_add is original
            dbg.start()
            out = lib.scale_add(a, b, scale=3.0)
            out.sum().backward()
            dbg.stop()
            dbg.step()
        assert lib.scale_add is original
    finally:
        models.finish(dbg)
    r0, r1 = (DumpReader(d.path) for d in find_rank_dirs(dump_path))
    key = f"{want}.scale_add.0.forward"
    assert r0.keys() == [key, "Tensor.sum.0.forward", "Tensor.sum.0.backward", f"{want}.scale_add.0.backward"]
    rec = r0[key]
    models.assert_stats(rec["input_args"][0], a)
    models.assert_stats(rec["input_args"][1], b)
    assert rec["input_kwargs"] == {"scale": {"type": "float", "value": 3.0}}
    models.assert_stats(rec["output"][0], a.detach() * 3.0 + torch.tanh(b))
    bwd = r0[f"{want}.scale_add.0.backward"]
    models.assert_stats(bwd["output"][0], torch.full((3, 4), 3.0))
    assert bwd["output"][1] is None
    # restored: the function's own torch calls are recorded instead
    assert not any(k.startswith(want + ".") for k in r1.keys())
    assert "Tensor.__mul__.0.forward" in r1.keys() and "Torch.tanh.0.forward" in r1.keys()


# -- nested calls -------------------------------------------------------------------------------------

def test_calls_inside_a_captured_api_are_not_recorded(tmp_path):
    logits = torch.randn(4, 5, requires_grad=True)
    target = torch.tensor([0, 3, 1, 4])
    x = torch.randn(2, 3, 8)

    def body(dbg, step):
        dbg.start()
        F.cross_entropy(logits, target).backward()
        F.layer_norm(x, (8,))
        F.gelu(x)
        torch.nn.functional.softmax(x, dim=-1)
        dbg.stop()

    r = one_debugger_run(tmp_path, "L1", body)[0]
    assert r.keys() == ["Functional.cross_entropy.0.forward", "Functional.cross_entropy.0.backward",
                        "Functional.layer_norm.0.forward", "Functional.gelu.0.forward", "Functional.softmax.0.forward"]
    models.assert_stats(r["Functional.cross_entropy.0.forward"]["output"][0], F.cross_entropy(logits, target))


# -- start / stop within a step -------------------------------------------------------------------------

def test_backward_after_stop_and_restart_within_a_step(tmp_path):
    """stop() before backward: backward is still recorded until step(); a second start() in the same
    step continues the call counters; nothing between stop() and start() is recorded."""
    model = models.build("dropout")
    model.drop.p = 0.0
    (x, y), = models.batches("dropout", 1)

    def body(dbg, step):
        dbg.start(model)
        loss = F.cross_entropy(model(x), y)
        dbg.stop()
        torch.tanh(x)  # not recorded
        loss.backward()
        dbg.start(model)
        model(x)
        dbg.stop()

    r = one_debugger_run(tmp_path, "mix", body)[0]
    keys = r.keys()
    assert "Functional.linear.0.backward" in keys and "Module.l.Linear.backward.0" in keys
    assert "Module.l.Linear.parameters_grad.0" in keys
    models.assert_stats(r["Module.l.Linear.parameters_grad.0"]["weight"][0], model.l.weight.grad)
    assert not any(k.startswith("Torch.tanh") for k in keys)
    assert "Functional.linear.2.forward" in keys and "Module.l.Linear.forward.1" in keys
    models.assert_stats(r["Module.l.Linear.forward.1"]["input_args"][0], x)


# -- extra_info ---------------------------------------------------------------------------------------

def test_extra_info_false_writes_no_structure(tmp_path, full):
    """extra_info false: no stack.json and no construct.json (as msProbe); the data records are unchanged."""
    ref = full("inplace", "mix")
    run = models.run_dump(tmp_path, "inplace", "mix", "statistics", common={"extra_info": False})
    for step in (0, 1):
        r = run.readers[step]
        assert r.keys() == ref.readers[step].keys()
        assert r["Module.l.Linear.forward.0"] == ref.readers[step]["Module.l.Linear.forward.0"]
        assert sorted(os.listdir(r.rank_dir)) == ["dump.json"]


# -- async_dump -----------------------------------------------------------------------------------

def test_async_dump_statistics_equal_the_synchronous_ones(tmp_path, full):
    ref = full("transformer", "mix")
    run = models.run_dump(tmp_path, "transformer", "mix", "statistics", common={"async_dump": True})
    for step in (0, 1):
        r, rr = run.readers[step], ref.readers[step]
        assert r.keys() == rr.keys()
        for k in r.keys():
            assert r[k] == rr[k], k


def test_list_backward_key_selects_that_backward_record(tmp_path, full):
    ref = full("transformer", "L1")
    run = models.run_dump(tmp_path, "transformer", "L1", "statistics",
                          list=["Functional.linear.0.backward", "Torch.matmul.1.backward"])
    for step in (0, 1):
        r = run.readers[step]
        assert list(r.keys()) == [k for k in ref.readers[step].keys()
                                  if k in ("Functional.linear.0.backward", "Torch.matmul.1.backward")]
        assert set(r.keys()) == {"Functional.linear.0.backward", "Torch.matmul.1.backward"}
        for key in r.keys():
            assert r[key] == ref.readers[step][key]
        models.assert_stats(r["Functional.linear.0.backward"]["output"][1], run.history[step]["grads"]["l.weight"])


def test_list_module_backward_key_mix(tmp_path, full):
    ref = full("transformer", "mix")
    run = models.run_dump(tmp_path, "transformer", "mix", "statistics", list=["Module.l.Linear.backward.0"])
    for step in (0, 1):
        r = run.readers[step]
        assert "Module.l.Linear.backward.0" in r.keys() and "Module.l.Linear.forward.0" not in r.keys()
        assert r["Module.l.Linear.backward.0"] == ref.readers[step]["Module.l.Linear.backward.0"]
        # the calls inside the module follow the module's selection: their backward records only
        assert all(k.endswith(".backward") or ".backward." in k or ".parameters_grad." in k for k in r.keys())


def test_non_finite_scalars_and_statistics_are_strict_json(tmp_path):
    """The PyTorch writer trusts its records to hold no NaN/inf float: scalar arguments
    (masked_fill(mask, -inf)) and statistics of non-finite tensors must arrive as strings."""
    import json

    def no_constants(name):
        raise AssertionError(f"bare {name} in dump.json")

    dbg = PrecisionDebugger(task="statistics", dump_path=str(tmp_path), level="L1")
    dbg.start()
    scores = torch.randn(2, 4).masked_fill(torch.tensor([[True, False, False, True]] * 2), float("-inf"))
    torch.softmax(scores, dim=-1)
    F.pad(torch.ones(3), (1, 1), value=float("nan"))
    dbg.stop()
    dbg.step()
    (rank_dir,) = find_rank_dirs(str(tmp_path))
    with open(os.path.join(rank_dir.path, "dump.json"), encoding="utf-8") as f:
        data = json.load(f, parse_constant=no_constants)["data"]
    fill = data["Tensor.masked_fill.0.forward"]
    assert fill["input_args"][2] == {"type": "float", "value": "-inf"}
    assert fill["output"][0]["Min"] == "-inf" and fill["output"][0]["Mean"] == "-inf"
    assert data["Functional.pad.0.forward"]["input_kwargs"]["value"] == {"type": "float", "value": "nan"}


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_step_that_records_nothing_leaves_no_directory(tmp_path, level):
    """The step directory is made at the first record: a step whose calls are all filtered out leaves
    nothing behind, and the recorded step beside it is whole."""
    model = models.build("inplace")
    data = models.batches("inplace", 2)
    cfg = models.write_config(tmp_path, task="statistics", level=level, dump_path=str(tmp_path / "dump"),
                              statistics={"list": ["Functional.linear"]})
    dbg = PrecisionDebugger(config_path=cfg)
    for step, (x, y) in enumerate(data):
        dbg.start(model)
        if step == 0:
            torch.tanh(x)  # step 0 runs no linear: nothing matches the list
        else:
            type(model).loss_of(model(x), y).backward()
        dbg.stop()
        dbg.step()
    models.finish(dbg)
    assert os.listdir(tmp_path / "dump") == ["step1"]
    (rank_dir,) = find_rank_dirs(str(tmp_path / "dump"))
    assert any(k.startswith("Functional.linear.") for k in DumpReader(rank_dir.path).keys())

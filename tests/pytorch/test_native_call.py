"""The C path of the API mode's calls, the module hooks and the one-node backward hooks (msprobe._call,
src/msprobe/_native/call.c) against CallCapture's and OneNodeHook's Python flow (MSPROBE_NATIVE_RECORD=0): the
same models dumped by both give the same dump.json, construct.json and stack.json, byte for byte; it is taken
only where the session's filter takes every call; it leaks nothing."""

import gc
import json
import sys
import weakref

import pytest
import torch
import torch.nn.functional as F

import msprobe_test_models as zoo
from msprobe.pytorch import PrecisionDebugger, _state

pytest.importorskip("msprobe._call", reason="msprobe._call not built (no C compiler)")

FILES = ("dump.json", "construct.json", "stack.json")


def extra_calls(x):
    """Calls the zoo's forward passes make few of: keyword arguments, scalars (not finite, bool, str), lists and
    tuples and None among the arguments, tuple outputs, an in-place call with `out=`, a call under no_grad, a
    non-tensor output, operators (named from the caller's instruction), F.linear on a 3-d input (its product
    viewed back, the weight's gradient through a transpose) and under autocast (the weight cast, then
    transposed)."""
    h = torch.tanh(x)
    a = torch.clamp(h, min=-0.5, max=None)  # kwargs, one of them None
    a = torch.clamp(a, float("-inf"), float("inf"))  # scalars that are not finite
    q = torch.div(a, 3.0, rounding_mode="floor").sum(dim=1, keepdim=True)  # str and bool scalars
    q = torch.where(a > 5, float("nan"), q)  # (never taken: a NaN argument, finite values)
    c = torch.cat([a, h]).permute((1, 0))  # a list of tensors, a tuple of ints
    g = a[:, 1:].to(torch.float64).to(dtype=torch.float32)  # an index tuple, a dtype (positional, keyword)
    g = g[..., ::2] + g[:, torch.tensor(2):]  # Ellipsis, a slice with a step, a slice bound that is a tensor
    g = g.reshape(g.shape).sum(dim=0, keepdim=True)  # a torch.Size; keyword scalars, with gradients
    v, i = torch.max(a, dim=1)  # a named tuple
    parts = torch.split(a, 2, dim=1)  # a plain tuple of tensors
    s = (a * 0.5 + 1).sum()  # Tensor methods with scalars
    buf = torch.zeros_like(a)
    with torch.no_grad():
        torch.add(a, h, out=buf)  # `out=`: an argument changed in place
        n = F.softmax(a, dim=-1).mul_(2)
    shape = a.size()  # a torch.Size out
    m = -h
    m += 1
    m = (m > 0.5).float() * m @ torch.ones(6, 2)
    w = torch.linspace(-1, 1, 18).reshape(3, 6).requires_grad_()
    y = F.linear(h.unsqueeze(0), w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = F.linear(h, w).float()
    return (s + v.sum() + parts[0].sum() + n.sum() + buf.sum() + shape[0] + i.float().sum() + m.sum() + y.sum()
            + z.sum() + q.sum() + c.sum() + g.sum())


def dump(tmp_path, monkeypatch, native, name, level, tag):
    """The three files of two dumped training steps of zoo model `name` (plus `extra_calls`), with the
    C path on or off."""
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1" if native else "0")
    from msprobe import _call

    node_hooks = []
    _call.made_hooks(node_hooks)
    out = tmp_path / tag
    debugger = PrecisionDebugger(dump_path=str(out), task="statistics", level=level)
    model, data = zoo.build(name), zoo.batches(name, 2)
    try:
        zoo.train(model, data, debugger, steps=2)
        debugger.start(model)
        x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0), requires_grad=True)
        extra_calls(x).backward()
        debugger.stop()
        debugger.step()
        if native:  # the C path took the calls, and fired the one-node backward hooks
            assert debugger_session_fast(debugger)
            assert node_hooks
            if level != "L1":  # and the C module hooks every module call, the Python ones none; the C
                assert _PY_HOOK_CALLS == [0]  # parameter-gradient hooks every parameters_grad record
                assert _PY_PARAMS_GRAD == [0]
            if level == "L1":  # with a reshape's pre-hook, and with transposes and casts to undo
                assert any(h.split for h in node_hooks)
                steps = {step for h in node_hooks for _, _, how in h.slots if how is not False for step, _ in how}
                assert steps == {0, 1, 2}
        else:
            assert not node_hooks
            assert level == "L1" or _PY_HOOK_CALLS[0] > 0 and _PY_PARAMS_GRAD[0] > 0  # (what the counts above see)
    finally:
        debugger.close()
        _call.made_hooks(None)
    files = {}
    for step_dir in sorted(out.glob("step*")):
        for rank_dir in sorted(step_dir.iterdir()):
            for f in FILES:
                path = rank_dir / f
                if path.exists():
                    files[f"{step_dir.name}/{f}"] = path.read_text()
    assert any(k.endswith("dump.json") for k in files)
    return files


def debugger_session_fast(debugger):
    """Whether the last session made had the C path (read back from the records: see dump())."""
    return _LAST_FAST[-1]


_LAST_FAST = []


_PY_HOOK_CALLS = [0]  # module calls the Python pre-hook counted (the C ModuleHook hands it its other cases)
_PY_PARAMS_GRAD = [0]  # parameters_grad records the session's Python emit_params_grad made


@pytest.fixture(autouse=True)
def note_fast(monkeypatch):
    from msprobe.core.naming import CallCounter
    from msprobe.pytorch.session import DumpSession

    _PY_HOOK_CALLS[0] = 0
    counter_next = CallCounter.next

    def counting(self, name):  # (a wrapper of the hook itself would add its frame to the stacks)
        if name.startswith("Module.") and not name.endswith(".parameters_grad"):
            _PY_HOOK_CALLS[0] += 1
        return counter_next(self, name)

    monkeypatch.setattr(CallCounter, "next", counting)
    _PY_PARAMS_GRAD[0] = 0
    emit_params_grad = DumpSession.emit_params_grad

    def counting_params(self, base, grads):
        _PY_PARAMS_GRAD[0] += 1
        return emit_params_grad(self, base, grads)

    monkeypatch.setattr(DumpSession, "emit_params_grad", counting_params)

    made = DumpSession._call_path

    def noting(self):
        got = made(self)
        _LAST_FAST.append(got is not None)
        return got

    monkeypatch.setattr(DumpSession, "_call_path", noting)
    yield
    _LAST_FAST.clear()


def dump_text(files, key):
    """A dump.json without its paths (each dump has its own directory)."""
    data = json.loads(files[key])
    data.pop("dump_data_dir", None)
    return json.dumps(data, sort_keys=False)


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_c_path_dumps_equal_the_python_flow(tmp_path, monkeypatch, name, level):
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "0")
    check_equal_dumps(tmp_path, monkeypatch, name, level)


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("name", ["transformer", "inplace"])
def test_c_path_dumps_equal_the_python_flow_on_the_device_path(tmp_path, monkeypatch, name, level):
    """Summaries into device slots, deferred to a batch (what an accelerator takes; here on the CPU)."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1")
    check_equal_dumps(tmp_path, monkeypatch, name, level)


def check_equal_dumps(tmp_path, monkeypatch, name, level):
    # (from one line: stack.json names it)
    fast, slow = [dump(tmp_path, monkeypatch, native, name, level, tag) for native, tag in ((True, "c"), (False, "py"))]
    assert sorted(fast) == sorted(slow)
    for key in fast:
        if key.endswith("dump.json"):
            assert dump_text(fast, key) == dump_text(slow, key), key
        else:
            assert fast[key] == slow[key], key


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_c_module_hooks_behind_dynamos_check(tmp_path, monkeypatch, level):
    """Once Dynamo is loaded a module's hooks ask torch.compiler.is_compiling() first (a traced call takes the
    Python hook); eager calls still take the C hooks, and dump the same."""
    import torch._dynamo  # noqa: F401

    from msprobe.pytorch.debugger import _compiled_capture
    assert _compiled_capture() is not None
    check_equal_dumps(tmp_path, monkeypatch, "cnn", level)


def test_other_filters_take_the_python_flow(tmp_path, monkeypatch):
    """A scope, a list, saved tensors, an overflow gate or a data_mode that leaves a part out: the flow
    in Python (the C path takes only a session whose filter takes every call, whole)."""
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1")
    for i, (task, extra) in enumerate([("statistics", {"list": ["Torch.tanh.0.forward"]}),
                                       ("statistics", {"scope": ["Torch.tanh.0.forward", "Torch.tanh.1.forward"]}),
                                       ("statistics", {"data_mode": ["input"]}), ("tensor", {}),
                                       ("overflow_check", {})]):
        cfg = tmp_path / f"{i}.json"
        cfg.write_text(json.dumps({"task": task, "level": "L1", "dump_path": str(tmp_path / str(i)), task: extra}))
        debugger = PrecisionDebugger(config_path=str(cfg))
        try:
            debugger.start()
            torch.tanh(torch.ones(3))
            debugger.stop()
            debugger.step()
        finally:
            debugger.close()
        assert _LAST_FAST and not _LAST_FAST[-1], (task, extra)


def test_an_error_in_the_call_leaves_depth_and_busy_as_they_were(tmp_path, monkeypatch):
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1")
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    try:
        debugger.start()
        with pytest.raises(RuntimeError):
            torch.mm(torch.ones(2, 3), torch.ones(2, 3))  # shapes that do not multiply
        assert (_state.depth, _state.busy) == (0, False)
        torch.tanh(torch.ones(3))  # recorded as before
        debugger.stop()
        debugger.step()
    finally:
        debugger.close()
    assert _LAST_FAST[-1]
    (path,) = list(tmp_path.rglob("dump.json"))
    data = json.loads(path.read_text())["data"]
    assert "Torch.tanh.0.forward" in data and "Torch.mm.0.forward" not in data


class _Failing(torch.nn.Module):
    """A submodule whose forward raises once its flag is set (after its inner Linear ran)."""

    def __init__(self):
        super().__init__()
        self.fail = False
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if self.fail:
            raise ValueError("boom")
        return y


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_a_module_that_raises_is_recorded_alike_and_training_goes_on(tmp_path, monkeypatch, level):
    """A module's forward that raises: its post-hook still runs (torch's always_call) with no output; on
    the C path as in the Python flow, the call is recorded, msprobe's state is left clean, and the next
    forward and backward are recorded as before: the same dump.json from both."""
    got = {}
    for native in (True, False):
        monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1" if native else "0")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), _Failing(), torch.nn.Tanh())
        x = torch.randn(2, 4, requires_grad=True)
        out = tmp_path / ("c" if native else "py")
        debugger = PrecisionDebugger(dump_path=str(out), task="statistics", level=level)
        try:
            debugger.start(model)
            model[1].fail = True
            with pytest.raises(ValueError, match="boom"):
                model(x)
            assert (_state.depth, _state.busy, _state.session.module_stack) == (0, False, [])
            model[1].fail = False
            model(x).sum().backward()
            debugger.stop()
            debugger.step()
        finally:
            debugger.close()
        assert _LAST_FAST[-1] is native
        (path,) = list(out.rglob("dump.json"))
        got[native] = {"dump.json": path.read_text()}
        data = json.loads(got[native]["dump.json"])["data"]
        assert data["Module.1._Failing.forward.0"]["output"] == [None]  # the call that raised
        assert "Module.1._Failing.backward.1" in data and "Module.1.lin.Linear.parameters_grad.0" in data
    assert dump_text(got[True], "dump.json") == dump_text(got[False], "dump.json")


def test_no_leaks_and_no_cycles(tmp_path, monkeypatch):
    """Every reference the C path takes is given back (tensors, arguments, the function, the session) and
    the session is freed by reference counting alone."""
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1")
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="mix")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))  # (a submodule: the module hooks' path too)
    x = torch.randn(4, 8, requires_grad=True)
    scale = 0.5
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        debugger.start(model)
        for _ in range(50):  # first-call caches
            torch.clamp(torch.tanh(model(x)), min=-scale).sum().backward()
        session = weakref.ref(_state.session)
        counts = lambda: [sys.getrefcount(o) for o in (x, scale, torch.tanh, torch.clamp, model[0].weight,
                                                        model[0].bias, model[0])]
        before = counts()
        for _ in range(2000):
            torch.clamp(torch.tanh(model(x)), min=-scale).sum().backward()
        assert counts() == before
        debugger.stop()
        debugger.step()
        assert session() is None, "the session is held by a reference cycle"
    finally:
        debugger.close()
        if was:
            gc.enable()
    assert _LAST_FAST[0]


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_kept_keys_follow_each_steps_counts(tmp_path, monkeypatch, level):
    """The C path hands out a key string it made before for the same name and index (a module or API called as
    the n-th of its name last step is so this step): each step's keys are still exactly its own calls', in
    steps that call a module and an API a different number of times, past the first 64 indices a name keeps."""
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    calls = [70, 1, 3]  # a step each: module calls (its Linear) and sigmoid calls alike
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    try:
        for n in calls:
            debugger.start(model)
            x = torch.randn(2, 4)
            for _ in range(n):
                x = torch.sigmoid(model(x)).sigmoid()  # one name under two prefixes
            debugger.stop()
            debugger.step()
    finally:
        debugger.close()
    assert _LAST_FAST and all(_LAST_FAST)
    for step, n in enumerate(calls):
        (rank_dir,) = (tmp_path / f"step{step}").iterdir()
        keys = list(json.loads((rank_dir / "dump.json").read_text())["data"])
        if level == "L0":
            want = [f"Module.0.Linear.forward.{i}" for i in range(n)]
        else:
            want = [k for i in range(n) for k in (f"Functional.linear.{i}.forward", f"Torch.sigmoid.{i}.forward",
                                                  f"Tensor.sigmoid.{i}.forward")]
        assert keys == want, (step, keys[:6])

"""The L1 mode's C handler (msprobe._call.PassOn, in front of ApiCapture.__torch_function__): the calls the
mode does not record (attribute reads, `p.grad` in an optimizer) run without the Python handler, and those it
records go to the session's C call path without it, except where the Python handler has to decide; it is
there only while the mode is entered and only while Dynamo cannot trace the mode (Dynamo traces the Python
handler: a C one would break its graph at every call). Whether it may be installed depends on what the
process compiled before, so each case runs in a fresh interpreter. That the dumps are the same with it as
without is test_native_call.py's (MSPROBE_NATIVE_RECORD=0 turns both C paths off)."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("msprobe._call", reason="msprobe._call not built (no C compiler)")

COMMON = """
import gc, json, os, sys, weakref
import torch
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.capture import api_mode

calls = []  # what reached the Python handler: (function name, recorded by the mode)
python_handler = api_mode.ApiCapture.__torch_function__

def counting(self, func, types, args=(), kwargs=None):
    calls.append((getattr(func, "__name__", str(func)), func in self._table))
    return python_handler(self, func, types, args, kwargs)

api_mode.ApiCapture.__torch_function__ = counting

def mode_of(debugger):
    return debugger._api_capture

def c_handler(debugger):
    return type(mode_of(debugger).__dict__.get("__torch_function__")).__name__

def train(model, debugger, opt):
    debugger.start(model)
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    debugger.stop()
    debugger.step()
"""


def run_script(tmp_path, body):
    script = tmp_path / "case.py"
    script.write_text(COMMON + textwrap.dedent(body).replace("DUMP", repr(str(tmp_path / "dump"))))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, MSPROBE_QUIET="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok"), done.stdout[-3000:]


@pytest.mark.usefixtures("host_path")
def test_unrecorded_calls_skip_the_python_handler(tmp_path):
    """The reads a model and an optimizer make never reach the Python handler, nor do the calls it records;
    the C handler is gone once the mode is left, and the debugger is freed at close. Before Dynamo is
    imported (torch imports it with the first optimizer or backward pass) the C handler watches for it
    and hands over to the Python handler at the first call after the import; once it is loaded, the C
    handler is installed with a compile-start callback to leave by."""
    run_script(tmp_path, """
    assert "torch._dynamo" not in sys.modules
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    debugger = PrecisionDebugger(task="statistics", dump_path=DUMP, level="L1")
    debugger.start(model)
    assert c_handler(debugger) == "PassOn"
    x = torch.randn(4, 8)
    assert x.shape == (4, 8) and x.dim() == 2  # attribute reads and methods the mode does not record
    y = model(x)
    assert calls == [], calls  # neither the reads nor the recorded calls reached Python
    import torch._dynamo  # (as the first backward pass does)
    del calls[:]
    x.shape
    assert "__torch_function__" not in mode_of(debugger).__dict__, "it stays after Dynamo's import"
    assert calls == [("__get__", False)], calls  # the Python handler took this read
    debugger.stop()
    debugger.step()

    # Dynamo loaded, nothing compiled: installed, with a compile-start callback to leave by
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger.start(model)
    assert c_handler(debugger) == "PassOn"
    from msprobe.pytorch.capture import compiled
    assert compiled._compiling in torch._dynamo.callback.callback_handler.start_callbacks
    del calls[:]
    loss = model(x).square().mean()
    loss.backward()
    opt.step()  # reads and sets p.grad of every parameter
    opt.zero_grad(set_to_none=True)
    assert calls == [], calls
    debugger.stop()
    assert "__torch_function__" not in mode_of(debugger).__dict__  # left with the mode
    debugger.step()

    mode = weakref.ref(mode_of(debugger))
    debugger.close()
    del debugger
    gc.collect()
    assert mode() is None
    step1 = os.path.join(DUMP, "step1")
    data = json.load(open(os.path.join(step1, os.listdir(step1)[0], "dump.json")))["data"]
    assert "Tensor.add_.0.forward" in data and "Functional.linear.0.backward" in data, sorted(data)
    step0 = os.path.join(DUMP, "step0")
    data = json.load(open(os.path.join(step0, os.listdir(step0)[0], "dump.json")))["data"]
    assert {"Functional.linear.0.forward", "Torch.tanh.0.forward", "Functional.linear.1.forward"} <= set(data)
    print("ok")
    """)


@pytest.mark.usefixtures("host_path")
def test_recorded_calls_reach_the_python_handler_where_it_decides(tmp_path):
    """What the C handler leaves to the Python one: a call that writes an argument behind its version
    (batch norm's running statistics), level L2 (an API call names its aten ops' parent). Operators are
    named from the caller's instruction in C as in Python."""
    run_script(tmp_path, """
    import torch.nn.functional as F
    import torch._dynamo  # (loaded before start(), as the first optimizer or backward pass loads it)
    lin = torch.nn.Linear(8, 8)
    debugger = PrecisionDebugger(task="statistics", dump_path=DUMP, level="L1")
    debugger.start(lin)
    assert c_handler(debugger) == "PassOn"
    x = torch.randn(4, 8, requires_grad=True)
    rm, rv = torch.zeros(8), torch.ones(8)
    y = F.batch_norm(x, rm, rv, training=True)
    assert calls == [("batch_norm", True)], calls
    del calls[:]
    z = -y
    z += 1
    w = (z > 0).float() * z + y.add(1)
    torch.tanh(lin(w)).sum().backward()
    assert calls == [], calls
    debugger.stop()
    debugger.step()
    debugger.close()
    step0 = os.path.join(DUMP, "step0")
    data = json.load(open(os.path.join(step0, os.listdir(step0)[0], "dump.json")))["data"]
    forward = [k for k in data if k.endswith(".forward")]
    for key in ("Functional.batch_norm.0.forward", "Tensor.__neg__.0.forward", "Tensor.__iadd__.0.forward",
                "Tensor.__gt__.0.forward", "Tensor.__mul__.0.forward", "Tensor.add.0.forward",
                "Tensor.__add__.0.forward", "Torch.tanh.0.forward", "Functional.linear.0.forward"):
        assert key in forward, (key, forward)

    del calls[:]
    debugger = PrecisionDebugger(task="statistics", dump_path=DUMP + "_l2", level="L2")
    debugger.start(lin)
    lin(torch.randn(4, 8))
    assert ("linear", True) in calls, calls
    debugger.stop()
    debugger.close()
    print("ok")
    """)


def test_it_steps_aside_before_dynamo_compiles(tmp_path):
    """A compiled model under L1: the C handler is installed at start(), leaves when Dynamo starts to
    compile (no graph break of its own: Dynamo traces the Python handler) and is not installed again in this process,
    not even after torch._dynamo.reset() (code compiled meanwhile guards on the Python handler)."""
    run_script(tmp_path, """
    import torch._dynamo
    from torch._dynamo.utils import counters
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled_model = torch.compile(model, backend="eager")
    debugger = PrecisionDebugger(task="statistics", dump_path=DUMP, level="L1")
    debugger.start(compiled_model)
    assert c_handler(debugger) == "PassOn"  # nothing compiled yet
    loss = compiled_model(torch.randn(4, 8)).square().mean()
    assert "__torch_function__" not in mode_of(debugger).__dict__  # left as the compile started
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    debugger.stop()
    debugger.step()
    # (the graph breaks msprobe's Python handler has anyway stay; none is the C handler's)
    assert counters["stats"]["unique_graphs"] >= 1
    assert not [reason for reason in counters["graph_break"] if "PassOn" in reason], dict(counters["graph_break"])
    train(compiled_model, debugger, opt)
    debugger.start(compiled_model)
    assert "__torch_function__" not in mode_of(debugger).__dict__
    debugger.stop()
    debugger.step()
    torch._dynamo.reset()
    debugger.start(model)
    assert "__torch_function__" not in mode_of(debugger).__dict__
    debugger.stop()
    debugger.step()
    debugger.close()
    step0 = os.path.join(DUMP, "step0")
    data = json.load(open(os.path.join(step0, os.listdir(step0)[0], "dump.json")))["data"]
    assert any(".linear." in k for k in data), sorted(data)[:10]  # the compiled graph's calls are recorded
    print("ok")
    """)

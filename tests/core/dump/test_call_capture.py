"""CallCapture (core/dump/call_capture.py) on its own, with numpy as the framework: records, structure,
deferred summaries and in-place calls, filters, nested calls, backward hand-off. No torch, no MindSpore."""

import contextlib
import json
import os
import subprocess
import sys

import numpy as np

from msprobe.core.config import config_from_dict
from msprobe.core.dump.call_capture import CallCapture
from msprobe.core.dump.capture import CaptureSession
from msprobe.core.dump.deferral import Deferral
from msprobe.core.dump.json_append import scalar_record
from msprobe.core.dump.records import common_value_record
from msprobe.core.dump.tensor_files import write_npy

# the stand-in framework's state: the session recording now, nesting depth
STATE = {"session": None, "depth": 0}


class LateSummaries:
    """Summaries that wait, in the core's Deferral, until something may change their arrays (or a resolve)."""

    def __init__(self):
        self.waiting = Deferral(self._read, 64)  # (array, record)
        self.launched = 0

    @property
    def pending(self):
        return len(self.waiting)

    def defer(self, a, rec):
        if self.waiting.add((a, rec), a.nbytes):
            self.launch()

    def _read(self, items):
        for a, rec in items:
            rec.update({"Max": float(a.max()), "Min": float(a.min()), "Mean": float(a.mean()),
                        "Norm": float(np.linalg.norm(a))})
        self.launched += len(items)

    def launch(self, touching=None):
        self.waiting.launch(touching)

    def start_resolve(self):
        return self.waiting.take()

    def clear(self):
        self.waiting.take()


class NumpyOps:
    """The stand-in's operations in the per-call flow (`s`: the session)."""

    work = contextlib.nullcontext

    def before_call(self, s):
        pass

    @staticmethod
    def run(func, args, kwargs):
        STATE["depth"] += 1
        try:
            return func(*args, **kwargs)
        finally:
            STATE["depth"] -= 1

    def before_mutation(self, s, args, kwargs):
        s.before_mutation(list(args))  # the core's deferral rule

    @staticmethod
    def result_of(s, out, args, inplace):
        return args[0] if inplace and out is None else out

    def backward_begin(self, s, key, parent, args, kwargs, save, inplace, module):
        return (key, parent), args

    def backward_end(self, s, state, key, parent, out, result, save, inplace, module):
        grad = np.ones_like(out)  # the stand-in's gradient arrives at once
        waits = []
        s.emit(key, {"input": [s.tensor_record(grad, f"{key}.input.0", save, waits)], "output": []}, waits)
        s.note_backward(key, parent)
        return out

    def param_record(self, s, p, stem, save, waits):
        return s.tensor_record(p, stem, save, waits)

    def amend_outputs(self, s, outs):
        pass


class GraphOps(NumpyOps):
    """A call that already ran elsewhere (as a compiled graph's do): its output records amended before
    they go out."""

    def amend_outputs(self, s, outs):
        for rec in outs:
            rec["from_graph"] = True


class NumpySession(CaptureSession):
    framework = "numpy"

    def __init__(self, cfg):
        super().__init__(cfg, 0, 0)
        self.calls = CALLS

    def _new_summarizer(self):
        return LateSummaries()

    def parent_key(self):
        return self.module_stack[-1] if self.module_stack else None

    def value_record(self, v, stem, save, waits):
        if isinstance(v, np.ndarray):
            return self.tensor_record(v, stem, save, waits)
        if v is None:
            return None
        if isinstance(v, (int, float, bool, str)):
            return scalar_record(v)
        if isinstance(v, (list, tuple)):
            return [self.value_record(x, f"{stem}.{i}", save, waits) for i, x in enumerate(v)]
        return common_value_record(v)

    def tensor_record(self, a, stem, save, waits):
        rec = {"type": "numpy.ndarray", "dtype": str(a.dtype), "shape": list(a.shape)}
        self.summarizer.defer(a, rec)
        if save:
            name = stem + ".npy"
            write_npy(self._writer().tensor_path(name), a.copy())
            rec["data_name"] = name
            self.tensor_count += 1
        return rec

    def save_tensor_file(self, value, path):
        write_npy(path, value)


CALLS = CallCapture(NumpyOps())


def api(name, inplace=False):
    """A stand-in API: recorded through CallCapture while a session records, unless nested."""
    def wrap(func):
        def call(*args, **kwargs):
            s = STATE["session"]
            if s is None or STATE["depth"]:
                return func(*args, **kwargs)
            return s.calls.call(s, "NP", name, func, args, kwargs, inplace=inplace)
        return call
    return wrap


add = api("add")(np.add)
mul = api("multiply")(np.multiply)


@api("add_", inplace=True)
def add_(x, y):
    x += y


@api("double_add")
def double_add(x, y):
    return add(add(x, y), y)  # nested: only double_add is recorded


class Layer:
    """A stand-in module: `out = x @ weight + 1`, its hooks around the call as a module's are."""

    def __init__(self, path, weight):
        self.path, self.weight = path, weight

    def __call__(self, x):
        s = STATE["session"]
        base = f"Module.{self.path}.Layer"
        key = f"{base}.forward.{s.counter.next(base)}"
        parent = s.module_stack[-1] if s.module_stack else None
        want = s.filter.want_call(key, s.module_stack)
        s.module_stack.append(key)
        frame = s.calls.begin(s, key, parent, (x,), {})[0] if want else None
        out = add(np.matmul(x, self.weight), 1.0)
        s.module_stack.pop()
        return s.calls.end(s, frame, out, params=[("weight", self.weight)]) if frame is not None else out


def run(tmp_path, body, task="statistics", level="mix", **block):
    """Run `body()` under a session with config `block` (the task's fields); returns (dump.json data,
    construct.json, rank dir, session)."""
    raw = {"task": task, "level": level, "dump_path": str(tmp_path), task: block}
    s = NumpySession(config_from_dict(raw))
    STATE["session"] = s
    try:
        body()
    finally:
        STATE["session"] = None
        s.close()
    rank_dir = tmp_path / "step0" / "rank0"
    with open(rank_dir / "dump.json", encoding="utf-8") as f:
        data = json.load(f)["data"]
    construct = {}
    if (rank_dir / "construct.json").exists():
        with open(rank_dir / "construct.json", encoding="utf-8") as f:
            construct = json.load(f)
    return data, construct, rank_dir, s


def test_a_call_is_recorded_with_its_arguments_and_output(tmp_path):
    x, y = np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, 6.0])
    data, _, _, _ = run(tmp_path, lambda: mul(add(x, y), 2.0))
    assert list(data) == ["NP.add.0.forward", "NP.add.0.backward", "NP.multiply.0.forward",
                          "NP.multiply.0.backward"]
    rec = data["NP.add.0.forward"]
    assert [a["Max"] for a in rec["input_args"]] == [3.0, 6.0]
    assert rec["input_kwargs"] == {}
    assert rec["output"][0]["Max"] == 9.0 and rec["output"][0]["shape"] == [3]
    assert data["NP.multiply.0.forward"]["input_args"][1] == scalar_record(2.0)


def test_nested_calls_are_not_recorded(tmp_path):
    data, _, _, _ = run(tmp_path, lambda: double_add(np.ones(2), np.ones(2)))
    assert list(data) == ["NP.double_add.0.forward", "NP.double_add.0.backward"]
    assert data["NP.double_add.0.forward"]["output"][0]["Max"] == 3.0


def test_module_records_parameters_and_structure(tmp_path):
    layer = Layer("fc", np.eye(2) * 2)
    data, construct, _, _ = run(tmp_path, lambda: layer(np.ones((1, 2))))
    key = "Module.fc.Layer.forward.0"
    assert data[key]["parameters"]["weight"]["Max"] == 2.0
    assert data[key]["output"][0]["Max"] == 3.0
    # the API inside the module hangs on it; the module has no parent; backward follows the same tree
    assert construct["NP.add.0.forward"] == key
    assert construct[key] is None
    assert construct["NP.add.0.backward"] == "Module.fc.Layer.backward.0"
    assert data["NP.add.0.backward"]["input"][0]["Max"] == 1.0


def test_inplace_call_reads_waiting_summaries_before_it_changes_them(tmp_path):
    """Summaries wait (deferred) until the in-place call: the records show the values as they were."""
    x = np.array([1.0, 2.0])
    data, _, _, s = run(tmp_path, lambda: (add(x, 0.0), add_(x, 10.0)))
    assert data["NP.add.0.forward"]["input_args"][0]["Max"] == 2.0
    assert data["NP.add_.0.forward"]["input_args"][0]["Max"] == 2.0
    assert data["NP.add_.0.forward"]["output"][0]["Max"] == 12.0  # the changed argument is the result


def test_list_filter_selects_calls_and_data_mode_parts(tmp_path):
    x = np.ones(3)
    data, _, _, _ = run(tmp_path, lambda: mul(add(x, x), x), level="L1", list=["multiply"],
                        data_mode=["forward", "input"])
    assert list(data) == ["NP.multiply.0.forward"]
    assert data["NP.multiply.0.forward"]["output"] == []
    assert data["NP.multiply.0.forward"]["input_args"][0]["Max"] == 2.0


def test_tensor_files_only_for_the_calls_that_save_them(tmp_path):
    x = np.arange(4.0)
    data, _, rank_dir, s = run(tmp_path, lambda: mul(add(x, x), x), task="tensor", level="L1",
                               list=["add"], data_mode=["forward"])
    rec = data["NP.add.0.forward"]
    name = rec["input_args"][0]["data_name"]
    assert name == "NP.add.0.forward.input.0.npy"
    assert np.array_equal(np.load(os.path.join(rank_dir, "dump_tensor_data", name)), x)
    assert s.tensor_count == 3  # two inputs, one output: multiply is filtered out


def test_core_flow_imports_no_framework():
    code = ("import sys, msprobe.core.dump.call_capture, msprobe.core.dump.capture; "
            "bad = [m for m in ('torch', 'mindspore') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_session_is_freed_without_the_cyclic_collector(tmp_path):
    """Neither CallCapture nor the ops hold the session: no reference cycle through them."""
    import gc
    import weakref
    gc.disable()
    try:
        x = np.ones(2)
        _, _, _, s = run(tmp_path, lambda: Layer("fc", np.eye(2))(add(x, x)))
        ref = weakref.ref(s)
        del s
        assert ref() is None
    finally:
        gc.enable()


def test_a_call_that_already_ran_keeps_its_given_stack_and_amended_outputs(tmp_path):
    """A compiled graph's call: begin and end around outputs already computed, the stack its site gave."""
    graph = CallCapture(GraphOps())
    x = np.ones(2)
    site = (("model.py", 7, "forward"),)

    def body():
        s = STATE["session"]
        frame, _ = graph.begin(s, "NP.add.0.forward", None, (x, x), {}, module=False, backward=False, stack=site)
        graph.end(s, frame, x + x)

    data, _, rank_dir, _ = run(tmp_path, body)
    rec = data["NP.add.0.forward"]
    assert rec["output"][0]["from_graph"] is True and rec["output"][0]["Max"] == 2.0
    assert "from_graph" not in rec["input_args"][0]
    with open(rank_dir / "stack.json", encoding="utf-8") as f:
        stacks = json.load(f)
    assert "model.py, line 7, in forward" in json.dumps(stacks)

"""Dump of real training runs: every zoo model x level (L0, L1, mix) x task (statistics, tensor, md5,
structure), two SGD steps under start/stop/step, read back with DumpReader and checked against values
computed here. Plus non-interference, md5 reproducibility and bf16 round trips."""

import os
import re
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import msprobe
from msprobe.core.dump.reader import find_rank_dirs
import msprobe_test_models as models  # loaded by conftest.py

MODELS = list(models.ZOO)
LEVELS = ["L0", "L1", "mix"]
TASKS = ["statistics", "tensor", "md5", "structure"]
PID = os.getpid()
MSPROBE_SRC = os.path.dirname(msprobe.__file__) + os.sep
THIS_FILE = os.path.basename(__file__)

API_RE = re.compile(r"^(Functional|Torch|Tensor|VF|Distributed)\.(\w+)\.(\d+)\.(forward|backward)$")
MODULE_RE = re.compile(r"^Module\.([\w.]+)\.(\w+)\.(forward|backward|parameters_grad)\.(\d+)$")
OPTIMIZER_RE = re.compile(r"^Optimizer\.(\w+)\.([\w.]+)\.(\d+)\.forward$")  # one parameter's update
HEX8 = re.compile(r"^[0-9a-f]{8}$")  # CRC-32 (core/checksum.py)
STACK_LINE = re.compile(r"^File .+, line \d+, in .+, \n .*$", re.S)

# APIs each model must show at L1/mix (forward), and APIs that only run inside another captured API
# (their appearance would mean nested calls are recorded twice).
EXPECTED_APIS = {
    "transformer": ["Functional.linear", "Functional.layer_norm", "Functional.softmax", "Functional.gelu",
                    "Torch.matmul", "Tensor.__add__", "Tensor.__truediv__", "Tensor.split", "Tensor.transpose",
                    "Functional.cross_entropy"],
    "cnn": ["Functional.conv2d", "Functional.batch_norm", "Functional.relu", "Functional.max_pool2d",
            "Torch.flatten", "Functional.linear", "Functional.cross_entropy"],
    "rnn": ["Functional.linear", "Torch.tanh", "VF.lstm", "Tensor.__getitem__", "Tensor.__add__",
            "Functional.cross_entropy"],
    "inplace": ["Functional.linear", "Functional.relu", "Tensor.__iadd__", "Tensor.mul_", "Functional.cross_entropy"],
    "dropout": ["Functional.linear", "Functional.relu", "Functional.dropout", "Functional.cross_entropy"],
    "dictout": ["Functional.linear", "Torch.sigmoid", "Torch.tanh", "Tensor.__mul__", "Tensor.pow",
                "Tensor.mean", "Functional.cross_entropy"],
}
NESTED_ONLY = ["Functional.log_softmax", "Torch.log_softmax", "Functional.nll_loss", "Torch.nll_loss",
               "Torch.layer_norm", "Torch.batch_norm", "Torch.conv2d", "Torch.dropout", "Tensor.bernoulli_",
               "Torch.max_pool2d", "Torch.addmm", "Tensor.t", "Torch.softmax", "Tensor.softmax",
               "Torch._C._nn.gelu", "Tensor.add.", "Torch.lstm"]
# The first captured API of each model and the module whose parameter gradients are checked.
FIRST_API = {name: "Functional.linear" for name in MODELS}
FIRST_API["cnn"] = "Functional.conv2d"
FIRST_MODULE = {name: ("l", "Linear") for name in MODELS}
FIRST_MODULE["cnn"] = ("conv", "Conv2d")


def first_layer(name, params, x):
    """The first layer's output recomputed here from the parameters before the step."""
    if name == "cnn":
        return F.conv2d(x, params["conv.weight"], params["conv.bias"], padding=1)
    return F.linear(x, params["l.weight"], params["l.bias"])


def first_param(name):
    return "conv" if name == "cnn" else "l"


# -- running the dumps (each combination once per module) ----------------------------------------------

@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    cache = {}

    def get(name, level, task):
        if (name, level, task) not in cache:
            tmp = tmp_path_factory.mktemp(f"{name}_{level}_{task}")
            cache[name, level, task] = models.run_dump(tmp, name, level, task)
        return cache[name, level, task]
    return get


ALL = pytest.mark.parametrize("task", TASKS)
EVERY = [pytest.mark.parametrize("name", MODELS), pytest.mark.parametrize("level", LEVELS), ALL]


def every(f):
    for mark in reversed(EVERY):
        f = mark(f)
    return f


def keys_of(run, step):
    """Recorded keys; the structure task writes no data records, so its keys come from stack/construct."""
    r = run.readers[step]
    if run.task == "structure":
        return list(dict.fromkeys(list(r.construct) + list(r.stack)))
    return r.keys()


def fwd(keys):
    return [k for k in keys if k.endswith(".forward") or ".forward." in k]


def api_base(key):
    m = API_RE.match(key)
    return f"{m.group(1)}.{m.group(2)}" if m else None


# -- layout and envelope --------------------------------------------------------------------------------

@every
def test_layout(dumped, name, level, task):
    run = dumped(name, level, task)
    assert sorted(os.listdir(run.dump_path)) == ["step0", "step1"]
    rank_dirs = find_rank_dirs(run.dump_path)
    assert [(r.step, r.rank, r.is_proc) for r in rank_dirs] == [(0, PID, True), (1, PID, True)]
    for step in (0, 1):
        step_dir = os.path.join(run.dump_path, f"step{step}")
        assert os.listdir(step_dir) == [f"proc{PID}"]
        files = set(os.listdir(os.path.join(step_dir, f"proc{PID}")))
        expected = {"dump.json", "stack.json", "construct.json"}
        if task == "tensor":
            expected.add("dump_tensor_data")
        assert files == expected


@every
def test_envelope(dumped, name, level, task):
    run = dumped(name, level, task)
    for step in (0, 1):
        rank_dir = os.path.join(run.dump_path, f"step{step}", f"proc{PID}")
        raw = models.read_raw(os.path.join(rank_dir, "dump.json"))
        assert list(raw) == ["task", "level", "framework", "dump_data_dir", "data"]
        assert raw["task"] == ("statistics" if task == "md5" else task)
        assert raw["level"] == level
        assert raw["framework"] == "pytorch"
        if task == "tensor":
            assert raw["dump_data_dir"] == os.path.abspath(os.path.join(rank_dir, "dump_tensor_data"))
        else:
            assert raw["dump_data_dir"] is None
        if task == "structure":
            assert raw["data"] == {}
        else:
            assert len(raw["data"]) > 0


# -- key grammar ------------------------------------------------------------------------------------------

@every
def test_key_grammar(dumped, name, level, task):
    run = dumped(name, level, task)
    model = run.model
    root_cls = type(model).__name__
    submodules = dict(model.named_modules())
    for step in (0, 1):
        keys = keys_of(run, step)
        assert keys
        api_keys = [k for k in keys if API_RE.match(k)]
        mod_keys = [k for k in keys if MODULE_RE.match(k)]
        opt_keys = [k for k in keys if OPTIMIZER_RE.match(k)]
        assert sorted(api_keys + mod_keys + opt_keys) == sorted(keys), \
            [k for k in keys if k not in api_keys + mod_keys + opt_keys]
        # L1/mix: the optimizer step, one record per parameter it updates, named as the model names it
        if level in ("L1", "mix") and task != "structure":
            trained = {n for n, p in model.named_parameters() if p.requires_grad}
            assert {OPTIMIZER_RE.match(k).group(2) for k in opt_keys} <= trained and opt_keys
        elif level == "L0":
            assert not opt_keys
        if level == "L0":
            assert not api_keys
        if level == "L1":
            assert not mod_keys
        if level in ("L1", "mix"):
            assert api_keys
        if level in ("L0", "mix"):
            assert mod_keys
        # modules: path is a real non-root submodule of that class; the root itself is not recorded
        for k in mod_keys:
            path, cls = MODULE_RE.match(k).group(1, 2)
            assert path in submodules and path != "", k
            assert type(submodules[path]).__name__ == cls, k
            assert not k.startswith(f"Module.{root_cls}.")
        if level in ("L0", "mix"):
            bases = {MODULE_RE.match(k).group(1) for k in mod_keys if ".forward." in k}
            assert bases == {p for p in submodules if p}  # every submodule runs once per step
            mpath, mcls = FIRST_MODULE[name]
            assert f"Module.{mpath}.{mcls}.forward.0" in keys
            if task != "structure" or level == "mix":
                assert f"Module.{mpath}.{mcls}.backward.0" in keys
            if task != "structure":
                assert f"Module.l.Linear.parameters_grad.0" in keys
                assert f"Module.{mpath}.{mcls}.parameters_grad.0" in keys
        if level in ("L1", "mix"):
            first = FIRST_API[name]
            assert f"{first}.0.forward" in keys
            if task != "structure" or level == "mix":
                assert f"{first}.0.backward" in keys
            present = {api_base(k) for k in api_keys}
            assert set(EXPECTED_APIS[name]) <= present, set(EXPECTED_APIS[name]) - present
            for nested in NESTED_ONLY:
                assert not any(k.startswith(nested + ("" if nested.endswith(".") else ".")) for k in keys), nested
        # call indices count 0..n-1 per API / module, in execution order, separately per step
        seen = {}
        for k in fwd(keys):
            if OPTIMIZER_RE.match(k):
                assert OPTIMIZER_RE.match(k).group(3) == "0", k  # one update per parameter per step
                continue
            m = API_RE.match(k)
            base, idx = (f"{m.group(1)}.{m.group(2)}", int(m.group(3))) if m else \
                (k.rsplit(".", 2)[0], int(k.rsplit(".", 1)[1]))
            assert idx == seen.get(base, 0), k
            seen[base] = idx + 1
        # a backward record belongs to a forward call of the same step
        if task != "structure":
            for k in keys:
                if k.endswith(".backward"):
                    assert k[:-len("backward")] + "forward" in keys, k
                elif ".backward." in k:
                    assert k.replace(".backward.", ".forward.") in keys, k
                elif ".parameters_grad." in k:
                    assert k.rsplit(".", 2)[0] + ".forward.0" in keys, k


def test_operators_named_as_dunders(dumped):
    """`a + b` is Tensor.__add__, `z += h` Tensor.__iadd__, `x / s` Tensor.__truediv__."""
    keys = dumped("transformer", "L1", "statistics").readers[0].keys()
    assert "Tensor.__add__.0.forward" in keys and "Tensor.__add__.1.forward" in keys
    assert "Tensor.__add__.0.backward" in keys
    assert "Tensor.__truediv__.0.forward" in keys
    assert not any(k.startswith("Tensor.add.") for k in keys)
    keys = dumped("inplace", "L1", "statistics").readers[0].keys()
    assert "Tensor.__iadd__.0.forward" in keys and "Tensor.mul_.0.forward" in keys


# -- construct.json ---------------------------------------------------------------------------------------

@every
def test_construct(dumped, name, level, task):
    run = dumped(name, level, task)
    for step in (0, 1):
        r = run.readers[step]
        raw = models.read_raw(os.path.join(r.rank_dir, "construct.json"))
        if level == "L1":
            assert raw == {}
            continue
        assert raw
        for node, parent in raw.items():
            if parent == "optimizer":  # APIs run by optimizer.step(), and its parameter updates
                assert (API_RE.match(node) or OPTIMIZER_RE.match(node)) and node.endswith(".forward"), node
                continue
            assert parent is None or (MODULE_RE.match(parent) and parent in raw), (node, parent)
            if parent is not None and ".backward." in node or node.endswith(".backward"):
                assert parent is None or ".backward." in parent, (node, parent)
        if task != "structure":  # every record but parameters_grad (as msProbe) has its place
            assert set(raw) == {k for k in r.keys() if ".parameters_grad." not in k}
        assert not any(".parameters_grad." in k for k in raw)
        if name == "transformer":
            assert raw["Module.attn.qkv.Linear.forward.0"] == "Module.attn.Attention.forward.0"
            assert raw["Module.attn.Attention.forward.0"] is None  # its parent is the (unrecorded) root
            assert raw["Module.l.Linear.forward.0"] is None
            assert raw["Module.attn.qkv.Linear.backward.0"] == "Module.attn.Attention.backward.0"
            if level == "mix":
                assert raw["Functional.linear.0.forward"] == "Module.l.Linear.forward.0"
                assert raw["Functional.linear.0.backward"] == "Module.l.Linear.backward.0"
                assert raw["Functional.linear.1.forward"] == "Module.attn.qkv.Linear.forward.0"
                assert raw["Torch.matmul.0.forward"] == "Module.attn.Attention.forward.0"
                assert raw["Functional.softmax.0.forward"] == "Module.attn.Attention.forward.0"
                assert raw["Tensor.__add__.0.forward"] is None  # in the root's own forward
                assert raw["Functional.cross_entropy.0.forward"] is None
        if level == "mix":
            mpath, mcls = FIRST_MODULE[name]
            assert raw[f"{FIRST_API[name]}.0.forward"] == f"Module.{mpath}.{mcls}.forward.0"


def test_structure_task_has_the_statistics_task_structure(dumped):
    for level in ("L0", "mix"):
        a = dumped("transformer", level, "structure").readers[0]
        b = dumped("transformer", level, "statistics").readers[0]
        assert a.construct == b.construct
        assert set(a.stack) == set(fwd(b.keys()))


# -- forward statistics -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("task", ["statistics", "tensor", "md5"])
def test_forward_statistics(dumped, name, level, task):
    run = dumped(name, level, task)
    p = first_param(name)
    for step in (0, 1):
        r = run.readers[step]
        h = run.history[step]
        x, params = h["x"], h["params_before"]
        out = first_layer(name, params, x)
        if level in ("L1", "mix"):
            rec = r[f"{FIRST_API[name]}.0.forward"]
            assert set(rec) == {"input_args", "input_kwargs", "output"}
            models.assert_stats(rec["input_args"][0], x)
            assert rec["input_args"][0]["requires_grad"] is False
            models.assert_stats(rec["input_args"][1], params[f"{p}.weight"])
            assert rec["input_args"][1]["requires_grad"] is True
            models.assert_stats(rec["input_args"][2], params[f"{p}.bias"])
            models.assert_stats(rec["output"][0], out)
            if name != "dictout":
                ce = r["Functional.cross_entropy.0.forward"]
                models.assert_stats(ce["output"][0], h["loss"])
        if level in ("L0", "mix"):
            mpath, mcls = FIRST_MODULE[name]
            rec = r[f"Module.{mpath}.{mcls}.forward.0"]
            assert set(rec) == {"input_args", "input_kwargs", "output", "parameters"}
            assert len(rec["input_args"]) == 1 and rec["input_kwargs"] == {}
            models.assert_stats(rec["input_args"][0], x)
            assert set(rec["parameters"]) == {"weight", "bias"}
            models.assert_stats(rec["parameters"]["weight"], params[f"{p}.weight"])
            models.assert_stats(rec["parameters"]["bias"], params[f"{p}.bias"])
            models.assert_stats(rec["output"][0], out)
        for key, value in r.items():
            for t in models.tensor_records(value):
                assert {"type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"} <= set(t), key
                assert ("md5" in t) == (task == "md5"), key
                assert ("data_name" in t) == (task == "tensor"), key
                if task == "md5":
                    assert HEX8.match(t["md5"]), (key, t["md5"])


def test_nested_outputs_keep_their_shape(dumped):
    """A module returning a tuple has a two-element output list; the LSTM's (out, (h, c)) nests."""
    r = dumped("dictout", "mix", "statistics").readers[0]
    h = dumped("dictout", "mix", "statistics").history[0]
    rec = r["Module.heads.TwoHeads.forward.0"]
    assert len(rec["output"]) == 2
    a, b = h["out"]["aux"]
    models.assert_stats(rec["output"][0], a)
    models.assert_stats(rec["output"][1], b)
    assert rec["parameters"] == {}
    rnn = dumped("rnn", "mix", "statistics").readers[0]["Module.rnn.LSTM.forward.0"]
    assert len(rnn["output"]) == 2 and len(rnn["output"][1]) == 2
    assert rnn["output"][0]["shape"] == [3, models.SmallRNN.SEQ, models.SmallRNN.HID]
    assert rnn["output"][1][0]["shape"] == [1, 3, models.SmallRNN.HID]
    assert set(rnn["parameters"]) == {"weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"}


def test_inplace_module_records_input_before_mutation(dumped):
    """ReLU(inplace=True): the module's input statistics are those before the ReLU overwrote it."""
    run = dumped("inplace", "mix", "statistics")
    for step in (0, 1):
        h = run.history[step]
        pre = first_layer("inplace", h["params_before"], h["x"])
        r = run.readers[step]
        models.assert_stats(r["Module.act.ReLU.forward.0"]["input_args"][0], pre)
        models.assert_stats(r["Module.act.ReLU.forward.0"]["output"][0], F.relu(pre))
        models.assert_stats(r["Functional.relu.0.forward"]["input_args"][0], pre)
        assert r["Functional.relu.0.forward"]["input_kwargs"]["inplace"] == {"type": "bool", "value": True}
        # z += h; z.mul_(2): each in-place API sees the tensor as it was before it, and its output after
        p = h["params_before"]
        post = F.relu(pre)
        z0 = F.linear(post, p["l2.weight"], p["l2.bias"])
        iadd, mul = r["Tensor.__iadd__.0.forward"], r["Tensor.mul_.0.forward"]
        models.assert_stats(iadd["input_args"][0], z0)
        models.assert_stats(iadd["input_args"][1], post)
        models.assert_stats(iadd["output"][0], z0 + post)
        models.assert_stats(mul["input_args"][0], z0 + post)
        assert mul["input_args"][1] == {"type": "int", "value": 2}
        models.assert_stats(mul["output"][0], (z0 + post) * 2)
        models.assert_stats(r["Module.l2.Linear.forward.0"]["output"][0], z0)  # before `z += h`


# -- backward statistics ------------------------------------------------------------------------------

def _logits(name, out):
    logits = out["logits"] if name == "dictout" else out
    return logits.reshape(-1, logits.shape[-1])


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("task", ["statistics", "tensor", "md5"])
def test_backward_statistics(dumped, name, level, task):
    run = dumped(name, level, task)
    p = first_param(name)
    mpath, mcls = FIRST_MODULE[name]
    for step in (0, 1):
        r = run.readers[step]
        h = run.history[step]
        grads = h["grads"]
        for key, rec in r.items():
            if key.endswith(".backward") or ".backward." in key:
                assert set(rec) == {"input", "output"}, key
                assert isinstance(rec["input"], list) and isinstance(rec["output"], list), key
        if level in ("L1", "mix"):
            rec = r[f"{FIRST_API[name]}.0.backward"]
            fwd_out = r[f"{FIRST_API[name]}.0.forward"]["output"][0]
            assert rec["input"][0]["shape"] == fwd_out["shape"]  # gradient of the output
            assert len(rec["output"]) == 3  # gradients of (x, weight, bias)
            assert rec["output"][0] is None  # x does not require grad
            models.assert_stats(rec["output"][1], grads[f"{p}.weight"])
            models.assert_stats(rec["output"][2], grads[f"{p}.bias"])
            # cross_entropy: d loss / d logits = (softmax - onehot) / N; d loss / d loss = 1
            ce = r["Functional.cross_entropy.0.backward"]
            assert ce["input"][0]["Max"] == ce["input"][0]["Min"] == 1.0
            logits, y = _logits(name, h["out"]), h["y"].reshape(-1)
            want = (torch.softmax(logits, -1) - F.one_hot(y, logits.shape[-1])) / y.numel()
            got = ce["output"][0]
            assert got["shape"] == list(want.shape)
            for stat, value in models.stats_of(want).items():
                assert got[stat] == pytest.approx(value, rel=1e-4, abs=1e-7), stat
            assert ce["output"][1] is None  # integer targets have no gradient
            if name == "rnn":  # nn.LSTM -> VF.lstm(input, (h0, c0), flat weights, ...)
                rec = r["VF.lstm.0.backward"]
                assert len(rec["input"]) == 3 and rec["input"][2] is None  # the cell state is unused
                assert rec["output"][1] is None and rec["output"][2] is None  # zero initial states
                for i, pname in enumerate(["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]):
                    models.assert_stats(rec["output"][3 + i], grads[f"rnn.{pname}"])
                if level == "mix":
                    assert r.construct["VF.lstm.0.forward"] == "Module.rnn.LSTM.forward.0"
                    assert r.construct["VF.lstm.0.backward"] == "Module.rnn.LSTM.backward.0"
            if name == "transformer":  # each Linear / LayerNorm runs once: its weight grad is the API's
                for i, path in enumerate(["l", "attn.qkv", "attn.proj", "fc1", "fc2", "head"]):
                    models.assert_stats(r[f"Functional.linear.{i}.backward"]["output"][1], grads[f"{path}.weight"])
                    models.assert_stats(r[f"Functional.linear.{i}.backward"]["output"][2], grads[f"{path}.bias"])
                for i, path in enumerate(["ln1", "ln2"]):
                    rec = r[f"Functional.layer_norm.{i}.backward"]
                    assert len(rec["output"]) == 3  # flat tensor inputs: (input, weight, bias)
                    models.assert_stats(rec["output"][1], grads[f"{path}.weight"])
                    models.assert_stats(rec["output"][2], grads[f"{path}.bias"])
        if level in ("L0", "mix"):
            pg = r["Module.l.Linear.parameters_grad.0"]
            assert set(pg) == {"weight", "bias"}
            assert pg["weight"][0]["Norm"] == pytest.approx(grads["l.weight"].norm().item(), rel=1e-6)
            models.assert_stats(pg["weight"][0], grads["l.weight"])
            models.assert_stats(pg["bias"][0], grads["l.bias"])
            bwd = r[f"Module.{mpath}.{mcls}.backward.0"]
            out_shape = r[f"Module.{mpath}.{mcls}.forward.0"]["output"][0]["shape"]
            assert bwd["input"][0]["shape"] == out_shape
            assert bwd["output"] == [None]  # the model input does not require grad
            # every parameter of the model gets exactly one parameters_grad record per step
            expect = {f"Module.{path}.{type(mod).__name__}.parameters_grad.0"
                      for path, mod in run.model.named_modules()
                      if path and any(True for _ in mod.parameters(recurse=False))}
            assert {k for k in r.keys() if ".parameters_grad." in k} == expect
            for k in expect:
                path = k.split(".")[1:-3]
                mod = run.model.get_submodule(".".join(path))
                for pname, _ in mod.named_parameters(recurse=False):
                    models.assert_stats(r[k][pname][0], grads[".".join(path + [pname])])


# -- tensor task: files -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("level", LEVELS)
def test_tensor_files(dumped, name, level):
    run = dumped(name, level, "tensor")
    p = first_param(name)
    for step in (0, 1):
        r = run.readers[step]
        names = []
        for key, value in r.items():
            for rec in models.tensor_records(value):
                assert rec["data_name"].startswith(key + ".") and rec["data_name"].endswith(".npy"), rec
                names.append(rec["data_name"])
                loaded = r.load_tensor(rec)
                arr = loaded.array
                assert list(arr.shape) == rec["shape"]
                assert str(arr.dtype) == rec["dtype"].replace("torch.", "")
                if arr.size == 0 or rec["Max"] is None:
                    continue
                t = torch.from_numpy(np.array(arr))
                if t.dtype == torch.bool:
                    continue
                want = models.stats_of(t)
                assert rec["Max"] == want["Max"] and rec["Min"] == want["Min"], rec["data_name"]
                assert rec["Mean"] == pytest.approx(want["Mean"], rel=1e-5, abs=1e-6), rec["data_name"]
                assert rec["Norm"] == pytest.approx(want["Norm"], rel=1e-5), rec["data_name"]
        assert len(names) == len(set(names))
        assert sorted(os.listdir(os.path.join(r.rank_dir, "dump_tensor_data"))) == sorted(names)
        h = run.history[step]
        if level in ("L1", "mix"):
            rec = r[f"{FIRST_API[name]}.0.forward"]
            assert rec["input_args"][0]["data_name"] == f"{FIRST_API[name]}.0.forward.input.0.npy"
            assert np.array_equal(r.load_tensor(rec["input_args"][0]).array, h["x"].numpy())
            assert np.array_equal(r.load_tensor(rec["input_args"][1]).array, h["params_before"][f"{p}.weight"].numpy())
            bwd = r[f"{FIRST_API[name]}.0.backward"]
            assert np.array_equal(r.load_tensor(bwd["output"][1]).array, h["grads"][f"{p}.weight"].numpy())
        if level in ("L0", "mix"):
            pg = r["Module.l.Linear.parameters_grad.0"]
            assert pg["weight"][0]["data_name"] == "Module.l.Linear.parameters_grad.0.weight.npy"
            assert np.array_equal(r.load_tensor(pg["weight"][0]).array, h["grads"]["l.weight"].numpy())
            mpath, mcls = FIRST_MODULE[name]
            prm = r[f"Module.{mpath}.{mcls}.forward.0"]["parameters"]["weight"]
            assert prm["data_name"] == f"Module.{mpath}.{mcls}.forward.0.parameters.weight.npy"
            assert np.array_equal(r.load_tensor(prm).array, h["params_before"][f"{p}.weight"].numpy())


# -- stack.json -----------------------------------------------------------------------------------------

@every
def test_stack(dumped, name, level, task):
    run = dumped(name, level, task)
    for step in (0, 1):
        r = run.readers[step]
        raw = models.read_raw(os.path.join(r.rank_dir, "stack.json"))
        assert list(raw) == [str(i) for i in range(len(raw))]
        owners = {}
        stacks = set()
        for idx, entry in raw.items():
            assert isinstance(entry, list) and len(entry) == 2
            keys, lines = entry
            assert keys and lines
            assert tuple(lines) not in stacks, "stack.json is not deduplicated"
            stacks.add(tuple(lines))
            for k in keys:
                assert k not in owners, f"{k} listed under stacks {owners[k]} and {idx}"
                owners[k] = idx
            for line in lines:
                assert STACK_LINE.match(line), line
                assert MSPROBE_SRC not in line.split(",")[0], line  # msprobe's own frames left out
            assert any("models.py" in line for line in lines), lines
        assert any(THIS_FILE in line for _, lines in raw.values() for line in lines)
        if task != "structure":
            assert set(owners) == set(fwd(r.keys()))


# -- md5 --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("level", LEVELS)
def test_md5_is_the_crc32_of_the_bytes(dumped, level):
    """msProbe's value: zlib's CRC-32 of the tensor's bytes, 8 hex digits."""
    run = dumped("transformer", level, "md5")
    r = run.readers[0]
    x = run.history[0]["x"]
    want = f"{zlib.crc32(x.numpy().tobytes()):08x}"
    key = "Functional.linear.0.forward" if level != "L0" else "Module.l.Linear.forward.0"
    assert r[key]["input_args"][0]["md5"] == want
    w = run.history[0]["params_before"]["l.weight"]
    rec = r[key]["input_args"][1] if level != "L0" else r[key]["parameters"]["weight"]
    assert rec["md5"] == f"{zlib.crc32(w.numpy().tobytes()):08x}"


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_md5_reproducible_and_sensitive(tmp_path, level):
    a = models.run_dump(tmp_path / "a", "transformer", level, "md5")
    b = models.run_dump(tmp_path / "b", "transformer", level, "md5")
    for step in (0, 1):
        ra, rb = a.readers[step], b.readers[step]
        assert ra.keys() == rb.keys()
        n = 0
        for key in ra.keys():
            ma = [t["md5"] for t in models.tensor_records(ra[key])]
            mb = [t["md5"] for t in models.tensor_records(rb[key])]
            assert ma == mb, key
            assert all(isinstance(m, str) and HEX8.match(m) for m in ma), (key, ma)  # never null
            n += len(ma)
        assert n > 100
    model = models.build("transformer")
    with torch.no_grad():
        model.l.weight[0, 0] += 1e-3
    c = models.run_dump(tmp_path / "c", "transformer", level, "md5", model=model)
    ra, rc = a.readers[0], c.readers[0]
    same_x = ra["Functional.linear.0.forward"]["input_args"][0]["md5"]
    assert rc["Functional.linear.0.forward"]["input_args"][0]["md5"] == same_x  # the input did not change
    assert rc["Functional.linear.0.forward"]["input_args"][1]["md5"] != \
        ra["Functional.linear.0.forward"]["input_args"][1]["md5"]
    assert rc["Functional.linear.0.forward"]["output"][0]["md5"] != \
        ra["Functional.linear.0.forward"]["output"][0]["md5"]
    if level == "mix":
        for rec_a, rec_c in ((ra["Module.l.Linear.forward.0"], rc["Module.l.Linear.forward.0"]),):
            assert rec_c["parameters"]["weight"]["md5"] != rec_a["parameters"]["weight"]["md5"]
            assert rec_c["parameters"]["bias"]["md5"] == rec_a["parameters"]["bias"]["md5"]
            assert rec_c["output"][0]["md5"] != rec_a["output"][0]["md5"]
        assert rc["Module.l.Linear.parameters_grad.0"]["weight"][0]["md5"] != \
            ra["Module.l.Linear.parameters_grad.0"]["weight"][0]["md5"]


# -- non-interference -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["transformer", "cnn", "rnn", "inplace", "dropout", "dictout"])
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_training_is_bitwise_unchanged(tmp_path, name, level):
    """Losses, every gradient, the updated parameters and buffers, and the RNG state are identical
    with and without the debugger (dropout: the statistics consume no random numbers)."""
    data = models.batches(name, 2)
    results = []
    for with_debugger in (False, True):
        model = models.build(name)
        torch.manual_seed(1234)
        dbg = None
        if with_debugger:
            dbg, _ = models.make_debugger(tmp_path, level, "statistics")
        try:
            history = models.train(model, data, dbg, opt="adam")
        finally:
            if dbg is not None:
                models.finish(dbg)
        results.append((history, model.state_dict(), torch.get_rng_state()))
    (h0, s0, rng0), (h1, s1, rng1) = results
    for a, b in zip(h0, h1):
        assert torch.equal(a["loss"], b["loss"])
        assert a["grads"].keys() == b["grads"].keys() and a["grads"]
        for k in a["grads"]:
            assert torch.equal(a["grads"][k], b["grads"][k]), k
    assert s0.keys() == s1.keys()
    for k in s0:
        assert torch.equal(s0[k], s1[k]), k
    assert torch.equal(rng0, rng1)
    assert find_rank_dirs(str(tmp_path / "dump"))  # the debugged run did dump
    # and left no hook behind on the model
    for mod in model.modules():
        assert not mod._forward_hooks and not mod._forward_pre_hooks and not mod._backward_hooks
    for prm in model.parameters():
        assert not getattr(prm, "_post_accumulate_grad_hooks", None)


# -- bf16 -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["transformer", "inplace", "cnn"])
def test_bf16_tensors_round_trip(tmp_path, name):
    model = models.build(name).to(torch.bfloat16)
    data = [(x.to(torch.bfloat16), y) for x, y in models.batches(name, 2)]
    run = models.run_dump(tmp_path, name, "mix", "tensor", model=model, data=data)
    for step in (0, 1):
        r = run.readers[step]
        h = run.history[step]
        n_bf16 = 0
        for key, value in r.items():
            for rec in models.tensor_records(value):
                if rec["dtype"] != "torch.bfloat16":
                    continue
                n_bf16 += 1
                arr = r.load_tensor(rec).array
                assert arr.dtype == np.float32 and list(arr.shape) == rec["shape"]
                t = torch.from_numpy(np.array(arr))
                assert torch.equal(t.to(torch.bfloat16).float(), t), key  # exactly representable in bf16
                assert rec["Max"] == t.max().item() and rec["Min"] == t.min().item(), key
        assert n_bf16 > 20
        rec = r[f"{FIRST_API[name]}.0.forward"]["input_args"][0]
        assert rec["dtype"] == "torch.bfloat16"
        x = h["x"]
        assert np.array_equal(r.load_tensor(rec).array, x.float().numpy())
        models.assert_stats(rec, x)
        w = r[f"Module.{'.'.join(FIRST_MODULE[name])}.forward.0"]["parameters"]["weight"]
        assert w["dtype"] == "torch.bfloat16"
        assert np.array_equal(r.load_tensor(w).array, h["params_before"][f"{first_param(name)}.weight"].float().numpy())
        g = r["Module.l.Linear.parameters_grad.0"]["weight"][0]
        assert g["dtype"] == "torch.bfloat16"
        assert np.array_equal(r.load_tensor(g).array, h["grads"]["l.weight"].float().numpy())


def _inplace_reference_grads(h):
    """InPlaceNet's step recomputed out of place here: gradients at the ReLU's input and output."""
    p = {k: v.clone().requires_grad_(True) for k, v in h["params_before"].items()}
    pre = F.linear(h["x"], p["l.weight"], p["l.bias"])
    post = F.relu(pre)
    z0 = F.linear(post, p["l2.weight"], p["l2.bias"])
    z = (z0 + post) * 2
    loss = F.cross_entropy(F.linear(z, p["head.weight"], p["head.bias"]), h["y"])
    g_pre, g_post, g_z0 = torch.autograd.grad(loss, [pre, post, z0])
    assert torch.equal(loss.detach(), h["loss"])
    return g_pre, g_post, g_z0


@pytest.mark.parametrize("level", ["L1", "mix", "L0"])
def test_inplace_backward_is_complete(dumped, level):
    """F.relu(x, inplace=True) and nn.ReLU(inplace=True): backward `input` is the gradient at the ReLU
    output, backward `output` the gradient at its input (the in-place call must not hide that edge)."""
    run = dumped("inplace", level, "statistics")
    for step in (0, 1):
        r = run.readers[step]
        g_pre, g_post, g_z0 = _inplace_reference_grads(run.history[step])
        # l2's output is changed in place afterwards (z += h; z.mul_(2)): its backward `input` is the
        # gradient at the value l2 returned
        l2 = "Module.l2.Linear.backward.0" if level != "L1" else "Functional.linear.1.backward"
        for stat, value in models.stats_of(g_z0).items():
            assert r[l2]["input"][0][stat] == pytest.approx(value, rel=1e-5, abs=1e-7), (l2, stat)
        keys = []
        if level != "L0":
            keys.append("Functional.relu.0.backward")
        if level != "L1":
            keys.append("Module.act.ReLU.backward.0")
        for key in keys:
            rec = r[key]
            assert len(rec["input"]) == 1 and len(rec["output"]) == 1, key
            for got, want in ((rec["input"][0], g_post), (rec["output"][0], g_pre)):
                assert got is not None, key
                assert got["shape"] == list(want.shape)
                for stat, value in models.stats_of(want).items():
                    assert got[stat] == pytest.approx(value, rel=1e-5, abs=1e-7), (key, stat)
        first = "Module.l.Linear.backward.0" if level != "L1" else "Functional.linear.0.backward"
        for stat, value in models.stats_of(g_pre).items():
            assert r[first]["input"][0][stat] == pytest.approx(value, rel=1e-5, abs=1e-7), (first, stat)


def _reference_module_grads(name, h):
    """One step recomputed without msprobe; for every submodule, the gradient at each output and the
    gradient that flows out of the module into each input (its own contribution, through a view)."""
    model = models.build(name)
    model.load_state_dict(h["params_before"], strict=False)
    grads = {}

    def mark(v, store):
        if isinstance(v, torch.Tensor):
            if not v.requires_grad:
                store.append(None)
                return v
            v = v.view_as(v)
            v.retain_grad()
            store.append(v)
            return v
        if isinstance(v, (list, tuple)):
            return type(v)(mark(x, store) for x in v)
        return v

    handles = []
    for path, mod in model.named_modules():
        if not path:
            continue
        ins, outs = [], []
        grads[path] = (ins, outs)
        handles.append(mod.register_forward_pre_hook(lambda m, args, ins=ins: mark(args, ins)))
        handles.append(mod.register_forward_hook(lambda m, args, out, outs=outs: mark(out, outs)))
    loss = type(model).loss_of(model(h["x"]), h["y"])
    loss.backward()
    assert torch.equal(loss.detach(), h["loss"])
    for handle in handles:
        handle.remove()
    return {p: ([None if t is None else t.grad for t in ins], [None if t is None else t.grad for t in outs])
            for p, (ins, outs) in grads.items()}


def _assert_grad_record(rec, want, where):
    if want is None:
        assert rec is None, where
        return
    assert rec is not None, f"{where}: gradient missing"
    assert rec["shape"] == list(want.shape), where
    for stat, value in models.stats_of(want).items():
        assert rec[stat] == pytest.approx(value, rel=1e-4, abs=1e-6), (where, stat)


@pytest.mark.parametrize("name", ["transformer", "cnn", "rnn", "dictout"])
@pytest.mark.parametrize("level", ["L0", "mix"])
def test_module_backward_matches_reference(dumped, name, level):
    """Every module's backward record: `input` = gradients at its outputs, `output` = the gradients it
    sends to its inputs, also for modules containing recorded APIs or recorded child modules."""
    run = dumped(name, level, "statistics")
    for step in (0, 1):
        r = run.readers[step]
        ref = _reference_module_grads(name, run.history[step])
        for path, (g_in, g_out) in ref.items():
            cls = type(run.model.get_submodule(path)).__name__
            key = f"Module.{path}.{cls}.backward.0"
            rec = r[key]
            assert len(rec["input"]) == len(g_out) and len(rec["output"]) == len(g_in), key
            for i, want in enumerate(g_out):
                _assert_grad_record(rec["input"][i], want, f"{key} input {i}")
            for i, want in enumerate(g_in):
                _assert_grad_record(rec["output"][i], want, f"{key} output {i}")

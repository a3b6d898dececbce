"""A tiny model zoo for the dump tests: each model exercises one capture pain point.

Every model has a submodule `l` (an nn.Linear) whose parameter gradients the tests check, and a
`make_batch(generator)` static method returning `(inputs, targets)`; `loss_of(model, out, y)` turns
the model's output into a scalar loss. Sizes are tiny: two training steps take milliseconds.
"""

import json
import math
import os

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from msprobe.core.dump.reader import DumpReader, find_rank_dirs, iter_tensor_records
from msprobe.pytorch import PrecisionDebugger


class Attention(nn.Module):
    """Single-head-group self attention: qkv Linear, split, matmul, softmax, matmul, proj Linear."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q = q.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = F.softmax(att, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class TransformerBlock(nn.Module):
    """Pre-norm transformer block: LayerNorm, attention with softmax, GELU MLP, two residual adds
    (`a + b`, recorded as Tensor.__add__), a final Linear head and cross_entropy over tokens."""

    DIM, SEQ, CLASSES = 16, 6, 5

    def __init__(self, dim=DIM, heads=2, classes=CLASSES):
        super().__init__()
        self.l = nn.Linear(dim, dim)  # input projection: its input is the model input
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * dim, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.l(x)
        h = h + self.attn(self.ln1(h))
        h = h + self.fc2(self.act(self.fc1(self.ln2(h))))
        return self.head(h)

    @staticmethod
    def make_batch(gen):
        x = torch.randn(2, TransformerBlock.SEQ, TransformerBlock.DIM, generator=gen)
        y = torch.randint(0, TransformerBlock.CLASSES, (2, TransformerBlock.SEQ), generator=gen)
        return x, y

    @staticmethod
    def loss_of(out, y):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


class SmallCNN(nn.Module):
    """Conv2d, BatchNorm2d (running stats updated in place), max_pool2d, flatten, Linear."""

    CLASSES = 5

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.l = nn.Linear(4 * 4 * 4, self.CLASSES)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        h = F.max_pool2d(h, 2)
        h = torch.flatten(h, 1)
        return self.l(h)

    @staticmethod
    def make_batch(gen):
        return torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, SmallCNN.CLASSES, (4,), generator=gen)

    @staticmethod
    def loss_of(out, y):
        return F.cross_entropy(out, y)


class SmallRNN(nn.Module):
    """Linear embedding, nn.LSTM (tuple output `(out, (h, c))`, fused _VF kernel), Linear head."""

    IN, HID, SEQ, CLASSES = 6, 8, 5, 3

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(self.IN, self.HID)
        self.rnn = nn.LSTM(self.HID, self.HID, batch_first=True)
        self.head = nn.Linear(self.HID, self.CLASSES)

    def forward(self, x):
        out, (h, _) = self.rnn(torch.tanh(self.l(x)))
        return self.head(out[:, -1] + h[0])

    @staticmethod
    def make_batch(gen):
        x = torch.randn(3, SmallRNN.SEQ, SmallRNN.IN, generator=gen)
        return x, torch.randint(0, SmallRNN.CLASSES, (3,), generator=gen)

    @staticmethod
    def loss_of(out, y):
        return F.cross_entropy(out, y)


class InPlaceNet(nn.Module):
    """In-place ops on non-leaf tensors: ReLU(inplace=True) on a Linear output, `z += h` on another
    module's output, `z.mul_(2)`."""

    DIM, CLASSES = 8, 4

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(self.DIM, self.DIM)
        self.act = nn.ReLU(inplace=True)
        self.l2 = nn.Linear(self.DIM, self.DIM)
        self.head = nn.Linear(self.DIM, self.CLASSES)

    def forward(self, x):
        h = self.act(self.l(x))
        z = self.l2(h)
        z += h
        z.mul_(2)
        return self.head(z)

    @staticmethod
    def make_batch(gen):
        return torch.randn(6, InPlaceNet.DIM, generator=gen), torch.randint(0, InPlaceNet.CLASSES, (6,), generator=gen)

    @staticmethod
    def loss_of(out, y):
        return F.cross_entropy(out, y)


class DropoutNet(nn.Module):
    """Linear, Dropout (consumes the RNG in training mode), Linear."""

    DIM, CLASSES = 8, 4

    def __init__(self, p=0.5):
        super().__init__()
        self.l = nn.Linear(self.DIM, 16)
        self.drop = nn.Dropout(p)
        self.head = nn.Linear(16, self.CLASSES)

    def forward(self, x):
        return self.head(self.drop(F.relu(self.l(x))))

    @staticmethod
    def make_batch(gen):
        return torch.randn(6, DropoutNet.DIM, generator=gen), torch.randint(0, DropoutNet.CLASSES, (6,), generator=gen)

    @staticmethod
    def loss_of(out, y):
        return F.cross_entropy(out, y)


class TwoHeads(nn.Module):
    """A submodule returning a tuple, a root returning a dict {"logits", "aux": (a, b)}."""

    def forward(self, h):
        return torch.sigmoid(h), torch.tanh(h)


class DictOutNet(nn.Module):
    DIM, CLASSES = 8, 4

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(self.DIM, self.DIM)
        self.heads = TwoHeads()
        self.head = nn.Linear(self.DIM, self.CLASSES)

    def forward(self, x):
        a, b = self.heads(self.l(x))
        return {"logits": self.head(a * b), "aux": (a, b)}

    @staticmethod
    def make_batch(gen):
        return torch.randn(5, DictOutNet.DIM, generator=gen), torch.randint(0, DictOutNet.CLASSES, (5,), generator=gen)

    @staticmethod
    def loss_of(out, y):
        return F.cross_entropy(out["logits"], y) + 0.1 * out["aux"][1].pow(2).mean()


ZOO = {
    "transformer": TransformerBlock,
    "cnn": SmallCNN,
    "rnn": SmallRNN,
    "inplace": InPlaceNet,
    "dropout": DropoutNet,
    "dictout": DictOutNet,
}


def build(name, seed=0):
    """A freshly initialised model of the zoo, the same weights for the same seed."""
    torch.manual_seed(seed)
    return ZOO[name]()


def batches(name, n, seed=1):
    """n (x, y) batches for model `name`, drawn from a private generator (the global RNG untouched)."""
    gen = torch.Generator().manual_seed(seed)
    return [ZOO[name].make_batch(gen) for _ in range(n)]


def train(model, data, debugger=None, steps=2, opt="sgd"):
    """Train `steps` steps on `data`; with a debugger, wrap each step in start/stop/step.

    Returns:
        list of per-step dicts: loss (detached), grads {name: grad clone after backward},
        out (the detached model output), x, y.
    """
    loss_of = type(model).loss_of
    optim = (torch.optim.SGD(model.parameters(), lr=0.1) if opt == "sgd"
             else torch.optim.Adam(model.parameters(), lr=1e-2))
    history = []
    for i in range(steps):
        x, y = data[i % len(data)]
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        if debugger is not None:
            debugger.start(model)
        out = model(x)
        loss = loss_of(out, y)
        optim.zero_grad()
        loss.backward()
        optim.step()  # SGD / Adam without weight decay leave .grad as backward left it
        if debugger is not None:
            debugger.stop()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        history.append({"loss": loss.detach().clone(), "grads": grads, "params_before": params,
                        "out": _detach(out), "x": x, "y": y})
        if debugger is not None:
            debugger.step()
    return history


def _detach(v):
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, (list, tuple)):
        return type(v)(_detach(x) for x in v)
    if isinstance(v, dict):
        return {k: _detach(x) for k, x in v.items()}
    return v


# -- reading dumps back ------------------------------------------------------------------------------

def stats_of(t):
    """Max/Min/Mean/Norm of a tensor computed here, independently of msprobe (float tensors)."""
    x = t.detach().float()
    return {"Max": x.max().item(), "Min": x.min().item(), "Mean": x.mean().item(), "Norm": x.norm().item()}


def assert_stats(rec, t, rel=1e-5):
    """The tensor record `rec` describes tensor `t`: dtype, shape and statistics."""
    assert rec is not None, "expected a tensor record, got null"
    assert rec["type"] == "torch.Tensor"
    assert rec["dtype"] == str(t.dtype)
    assert rec["shape"] == list(t.shape)
    want = stats_of(t)
    assert rec["Max"] == want["Max"] and rec["Min"] == want["Min"], (rec, want)
    assert abs(rec["Mean"] - want["Mean"]) <= rel * max(1.0, abs(want["Mean"])), (rec, want)
    assert abs(rec["Norm"] - want["Norm"]) <= rel * max(1.0, abs(want["Norm"])), (rec, want)


def tensor_records(value):
    """Every tensor record (dict with type/dtype/shape) in a nested record structure."""
    return (rec for _, rec in iter_tensor_records(value))


def record_leaves(record, path=""):
    """{path: value} of a record's leaves (`.input_args[0].Max`: its value)."""
    if isinstance(record, dict):
        return {k: v for key, sub in record.items() for k, v in record_leaves(sub, f"{path}.{key}").items()}
    if isinstance(record, list):
        return {k: v for i, sub in enumerate(record) for k, v in record_leaves(sub, f"{path}[{i}]").items()}
    return {path: record}


def assert_same_leaves(host, device):
    """Two dumps' leaves ({path: value}) alike: the same paths in the same order, floats to the host kernel's
    rounding (the device path's reductions are torch's)."""
    import pytest
    assert list(device) == list(host)
    for key, want in host.items():
        got = device[key]
        assert got == (pytest.approx(want, rel=2e-6, abs=1e-6) if isinstance(want, float) else want), key


def read_raw(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def finish(debugger):
    """Flush and close a debugger (close() also ends its writer threads; each test builds its own)."""
    debugger.close()


def write_config(tmp_path, **fields):
    """Write config.json into tmp_path and return its path."""
    os.makedirs(str(tmp_path), exist_ok=True)
    path = os.path.join(str(tmp_path), "config.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fields, f)
    return path


# -- running a dump ------------------------------------------------------------------------------------

def make_debugger(tmp, level, task, common=None, **block):
    """A PrecisionDebugger on tmp/dump. md5 (summary_mode), the task block's fields (`block`: list,
    scope, data_mode, tensor_list ...) and extra common fields (`common`: step, rank ...) go through
    a config.json written in tmp, as a user would write them."""
    dump_path = str(tmp / "dump")
    if task == "md5" or block or common:
        real_task = "statistics" if task == "md5" else task
        if task == "md5":
            block["summary_mode"] = "md5"
        fields = dict(common or {}, task=real_task, level=level, dump_path=dump_path)
        if block:
            fields[real_task] = block
        cfg = write_config(tmp, **fields)
        return PrecisionDebugger(config_path=cfg), dump_path
    return PrecisionDebugger(dump_path=dump_path, level=level, task=task), dump_path


def run_dump(tmp, name, level, task, model=None, data=None, common=None, **block):
    """Train `name` two steps under a fresh debugger; returns the dump path, history and readers."""
    dbg, dump_path = make_debugger(tmp, level, task, common=common, **block)
    model = model if model is not None else build(name)
    data = data if data is not None else batches(name, 2)
    try:
        history = train(model, data, dbg)
    finally:
        finish(dbg)
    readers = {r.step: DumpReader(r.path) for r in find_rank_dirs(dump_path)}
    return SimpleNamespace(name=name, level=level, task=task, dump_path=dump_path, model=model,
                           history=history, readers=readers)

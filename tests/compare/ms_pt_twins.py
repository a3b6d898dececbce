"""Twin models in MindSpore and PyTorch, each written the way its framework is usually written, with
the same weights, for the migration compare (MindSpore target, PyTorch golden). Two families:

- "vision" (tuned on): Conv2d + BatchNorm2d + ReLU + MaxPool stem, one attention block over the
  pixels (LayerNorm, Dense/Linear q/k/v, softmax, GELU MLP, Dropout), cross-entropy, SGD.
- "text" (held out): Embedding + Conv1d, a causal attention block with a fused qkv projection
  (split), LayerNorm, GELU MLP, MSE loss, Adam.

`Plant` options change the MindSpore twin only: the planted differences of the migration suite.
Loaded with `load_private` (tests/ has no packages); benchmarks/ms_pt_migration.py runs the suite.
"""

import os

import numpy as np

PLANTS = ("conv_weight", "ln_eps", "gelu_tanh", "attn_scale", "residual_scale", "softmax_fp16",
          "bprop_scale", "weight_decay")
NEGATIVES = ("identical", "other_ops")
# MindSpore parameter names that differ from PyTorch's (the suffix after the last dot)
_PT_PARAM = {"gamma": "weight", "beta": "bias", "embedding_table": "weight",
             "moving_mean": "running_mean", "moving_variance": "running_var"}

DIM, HEADS_DIM, CLASSES, VOCAB, SEQ = 8, 8, 4, 20, 6


# ---------------------------------------------------------------------------------------------- MindSpore
def _ms_classes():
    import mindspore as ms
    from mindspore import nn, ops

    class GradScale(nn.Cell):
        """A Cell with a custom bprop (how MindSpore code scales or clips a gradient)."""

        def __init__(self, scale):
            super().__init__()
            self.scale = scale

        def construct(self, x):
            return x * 1.0

        def bprop(self, x, out, dout):
            return (dout * self.scale,)

    class Block(nn.Cell):
        def __init__(self, plant, causal, fused_qkv):
            super().__init__()
            eps = 1e-2 if plant == "ln_eps" else 1e-5
            self.norm1 = nn.LayerNorm((DIM,), epsilon=eps)
            self.fused_qkv = fused_qkv
            if fused_qkv:
                self.qkv = nn.Dense(DIM, 3 * DIM)
            else:
                self.q = nn.Dense(DIM, DIM)
                self.k = nn.Dense(DIM, DIM)
                self.v = nn.Dense(DIM, DIM)
            self.proj = nn.Dense(DIM, DIM)
            self.norm2 = nn.LayerNorm((DIM,))
            self.fc1 = nn.Dense(DIM, 2 * DIM)
            self.act = nn.GELU(approximate=plant == "gelu_tanh")
            self.fc2 = nn.Dense(2 * DIM, DIM)
            self.drop = nn.Dropout(p=0.0)
            self.grad_scale = GradScale(2.0) if plant == "bprop_scale" else None
            self.scale = (1.0 / DIM) if plant == "attn_scale" else DIM ** -0.5
            self.residual = 0.5 if plant == "residual_scale" else 1.0
            self.plant = plant
            self.causal = causal
            if causal:
                self.mask = ms.Tensor(np.tril(np.ones((SEQ, SEQ), np.float32)))

        def construct(self, x):
            t = x.shape[1]
            h = self.norm1(x)
            if self.fused_qkv:
                q, k, v = ops.split(self.qkv(h), DIM, axis=-1)
            else:
                q, k, v = self.q(h), self.k(h), self.v(h)
            if self.plant == "other_ops":  # the same math: k transposed by a full permutation
                scores = ops.matmul(q, ops.transpose(k, (0, 2, 1))) * self.scale
            else:
                scores = ops.matmul(q, k.swapaxes(-1, -2)) * self.scale
            if self.causal:
                m = self.mask[:t, :t]
                scores = scores + (1.0 - m) * -1e9
            if self.plant == "softmax_fp16":
                att = ops.softmax(scores.astype(ms.float16), axis=-1).astype(ms.float32)
            else:
                att = ops.softmax(scores, axis=-1)
            a = self.proj(ops.matmul(att, v))
            x = x + (a * self.residual if self.plant == "residual_scale" else a)
            m = self.fc2(self.act(self.fc1(self.norm2(x))))
            if self.grad_scale is not None:
                m = self.grad_scale(m)
            return x + self.drop(m)

    class Vision(nn.Cell):
        def __init__(self, plant=None):
            super().__init__()
            self.conv = nn.Conv2d(1, DIM, 3, pad_mode="pad", padding=1, has_bias=True)
            self.bn = nn.BatchNorm2d(DIM)
            self.relu = nn.ReLU()
            self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
            self.block = Block(plant, causal=False, fused_qkv=False)
            self.head = nn.Dense(DIM, CLASSES)

        def construct(self, x):
            h = self.pool(self.relu(self.bn(self.conv(x))))
            b, c = h.shape[0], h.shape[1]
            t = ops.transpose(h.reshape(b, c, -1), (0, 2, 1))
            t = self.block(t)
            return self.head(t.mean(axis=1))

    class Text(nn.Cell):
        def __init__(self, plant=None):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, DIM)
            self.conv = nn.Conv1d(DIM, DIM, 3, pad_mode="pad", padding=1, has_bias=True)
            self.block = Block(plant, causal=True, fused_qkv=True)
            self.norm = nn.LayerNorm((DIM,))
            self.head = nn.Dense(DIM, 1)

        def construct(self, ids):
            e = self.embed(ids)
            c = self.conv(e.swapaxes(1, 2)).swapaxes(1, 2)
            h = self.block(ops.tanh(c) + e)
            return self.head(self.norm(h)).squeeze(-1)

    return {"vision": Vision, "text": Text}


def build_ms(family, plant=None, seed=7):
    import mindspore as ms
    ms.set_seed(seed)
    net = _ms_classes()[family](plant)
    if plant == "conv_weight":
        w = net.conv.weight
        a = w.asnumpy().copy()
        a.flat[5] += 0.05 * float(a.max() - a.min())
        w.set_data(ms.Tensor(a))
    return net


def train_ms(family, net, x, y, plant=None, debugger=None, steps=1):
    """One training step per step, MindSpore style: value_and_grad + nn.SGD (vision) / nn.Adam (text)."""
    import mindspore as ms
    from mindspore import nn
    params = net.trainable_params()
    if plant == "weight_decay":  # weight decay on one parameter only (a group that asked for it)
        first = [p for p in params if p.name.endswith("head.weight")]
        params = [{"params": first, "weight_decay": 0.1},
                  {"params": [p for p in params if not p.name.endswith("head.weight")]}]
    if family == "vision":
        opt = nn.SGD(params, learning_rate=0.1)
        loss_fn = nn.CrossEntropyLoss()
    else:
        opt = nn.Adam(params, learning_rate=0.01)
        loss_fn = nn.MSELoss()
    net.set_train()
    grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    return _ms_models().run_steps(grad_fn, opt, ms.Tensor(x), ms.Tensor(y), steps, debugger, net)


def _ms_models():
    """tests/mindspore/models.py (its training loop), under the private name the MindSpore tests use."""
    import importlib.util
    import sys
    name = "msprobe_ms_test_models"
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mindspore", "models.py")
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


# ---------------------------------------------------------------------------------------------- PyTorch
def _pt_classes():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, causal, fused_qkv):
            super().__init__()
            self.norm1 = nn.LayerNorm(DIM)
            self.fused_qkv = fused_qkv
            if fused_qkv:
                self.qkv = nn.Linear(DIM, 3 * DIM)
            else:
                self.q = nn.Linear(DIM, DIM)
                self.k = nn.Linear(DIM, DIM)
                self.v = nn.Linear(DIM, DIM)
            self.proj = nn.Linear(DIM, DIM)
            self.norm2 = nn.LayerNorm(DIM)
            self.fc1 = nn.Linear(DIM, 2 * DIM)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(2 * DIM, DIM)
            self.drop = nn.Dropout(p=0.0)
            self.scale = DIM ** -0.5
            self.causal = causal
            if causal:
                self.register_buffer("mask", torch.tril(torch.ones(SEQ, SEQ)))

        def forward(self, x):
            t = x.shape[1]
            h = self.norm1(x)
            if self.fused_qkv:
                q, k, v = self.qkv(h).split(DIM, dim=-1)
            else:
                q, k, v = self.q(h), self.k(h), self.v(h)
            scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
            if self.causal:
                m = self.mask[:t, :t]
                scores = scores + (1.0 - m) * -1e9
            att = F.softmax(scores, dim=-1)
            x = x + self.proj(torch.matmul(att, v))
            return x + self.drop(self.fc2(self.act(self.fc1(self.norm2(x)))))

    class Vision(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, DIM, 3, padding=1)
            self.bn = nn.BatchNorm2d(DIM)
            self.relu = nn.ReLU()
            self.pool = nn.MaxPool2d(2, 2)
            self.block = Block(causal=False, fused_qkv=False)
            self.head = nn.Linear(DIM, CLASSES)

        def forward(self, x):
            h = self.pool(self.relu(self.bn(self.conv(x))))
            t = h.flatten(2).transpose(1, 2)
            t = self.block(t)
            return self.head(t.mean(dim=1))

    class Text(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, DIM)
            self.conv = nn.Conv1d(DIM, DIM, 3, padding=1)
            self.block = Block(causal=True, fused_qkv=True)
            self.norm = nn.LayerNorm(DIM)
            self.head = nn.Linear(DIM, 1)

        def forward(self, ids):
            e = self.embed(ids)
            c = self.conv(e.transpose(1, 2)).transpose(1, 2)
            h = self.block(torch.tanh(c) + e)
            return self.head(self.norm(h)).squeeze(-1)

    return {"vision": Vision, "text": Text}


def pt_name(ms_name):
    """The PyTorch parameter name of a MindSpore parameter (gamma -> weight, moving_mean -> running_mean)."""
    head, dot, last = ms_name.rpartition(".")
    return head + dot + _PT_PARAM.get(last, last)


def build_pt(family, ms_net):
    """The PyTorch twin holding `ms_net`'s weights (and BatchNorm statistics)."""
    import torch
    net = _pt_classes()[family]()
    state = {pt_name(n): torch.from_numpy(p.asnumpy().copy()) for n, p in ms_net.parameters_and_names()}
    own = net.state_dict()
    missing = [k for k in own if k not in state and not k.endswith(("num_batches_tracked", "mask"))]
    assert not missing, missing
    # nn.Conv1d's weight is (out, in, 1, k) in MindSpore, (out, in, k) in PyTorch
    net.load_state_dict({k: state[k].reshape(v.shape) if k in state else v for k, v in own.items()})
    return net


def train_pt(family, net, x, y, debugger=None, steps=1):
    """One training step per step, PyTorch style: loss.backward() + torch.optim.SGD / Adam."""
    import torch
    from torch import nn
    if family == "vision":
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        loss_fn = nn.CrossEntropyLoss()
    else:
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        loss_fn = nn.MSELoss()
    xt, yt = (torch.from_numpy(a).long() if a.dtype.kind == "i" else torch.from_numpy(a) for a in (x, y))
    losses = []
    for _ in range(steps):
        if debugger is not None:
            debugger.start(net)
        opt.zero_grad()
        loss = loss_fn(net(xt), yt)
        loss.backward()
        opt.step()
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(float(loss.detach()))
    return losses


def make_data(family, batch=4, seed=0):
    rng = np.random.default_rng(seed)
    if family == "vision":
        return (rng.standard_normal((batch, 1, 8, 8)).astype(np.float32),
                rng.integers(0, CLASSES, batch).astype(np.int32))
    return (rng.integers(0, VOCAB, (batch, SEQ)).astype(np.int32),
            rng.standard_normal((batch, SEQ)).astype(np.float32))

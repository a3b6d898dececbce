"""A tiny PyTorch model with one switchable planted divergence, dumped for the diagnosis tests.

`PlantedNet(plant)` is the same network with the same weights and data for every `plant`; each plant
changes exactly one op, so a diagnosis has one right answer:

| plant | what changes | where error is introduced |
|---|---|---|
| `None` | nothing | no divergence |
| `bf16_softmax` | the attention-like softmax runs in bfloat16 | `Functional.softmax.0.forward` |
| `ln_eps` | LayerNorm epsilon 1e-1 instead of 1e-5 | `Functional.layer_norm.0.forward` (`Module.ln.LayerNorm`) |
| `weight` | one weight of `fc2` perturbed by 5% of its range | `Functional.linear.1.forward` (`Module.fc2.Linear`) |
| `bad_backward` | the custom autograd Function's backward is 1.5x too large | `Module.act.Swish.backward.0` |
| `fp16_exp` | `exp` of the first layer runs in float16 and overflows | `Torch.exp.0.forward` |
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from msprobe.pytorch import PrecisionDebugger

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # dumped_training.py lies beside this file, whichever way it was loaded
    sys.path.append(HERE)
from dumped_training import train_dumped  # noqa: E402

PLANTS = ("bf16_softmax", "ln_eps", "weight", "bad_backward", "fp16_exp")

# (suspect #1 call key, direction, enclosing module or None) per plant, at level mix.
EXPECTED = {
    "bf16_softmax": ("Functional.softmax.0.forward", "forward", None),
    "ln_eps": ("Functional.layer_norm.0.forward", "forward", "Module.ln.LayerNorm.forward.0"),
    "weight": ("Functional.linear.1.forward", "forward", "Module.fc2.Linear.forward.0"),
    "bad_backward": ("Module.act.Swish.backward.0", "backward", None),
    "fp16_exp": ("Torch.exp.0.forward", "forward", None),
}


class SwishFn(torch.autograd.Function):
    """x * sigmoid(x) with a hand-written backward; `wrong=True` scales the gradient by 1.5."""

    @staticmethod
    def forward(ctx, x, wrong):
        ctx.save_for_backward(x)
        ctx.wrong = wrong
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        s = torch.sigmoid(x)
        g = grad * s * (1 + x * (1 - s))
        return (g * 1.5 if ctx.wrong else g), None


class Swish(nn.Module):
    def __init__(self, wrong_backward=False):
        super().__init__()
        self.wrong_backward = wrong_backward

    def forward(self, x):
        return SwishFn.apply(x, self.wrong_backward)


class PlantedNet(nn.Module):
    """Linear -> gate h * sigmoid(exp(h)) -> LayerNorm -> Swish (custom Function) -> x * softmax(x) -> Linear."""

    IN, DIM, CLASSES = 8, 16, 4

    def __init__(self, plant=None):
        super().__init__()
        self.plants = set(plant.split("+")) if plant else set()  # "a+b" plants both
        if self.plants - set(PLANTS):
            raise ValueError(f"plant {plant!r}; allowed: {', '.join(PLANTS)}, or several joined by '+'")
        self.fc1 = nn.Linear(self.IN, self.DIM)
        self.ln = nn.LayerNorm(self.DIM, eps=1e-1 if "ln_eps" in self.plants else 1e-5)
        self.act = Swish(wrong_backward="bad_backward" in self.plants)
        self.fc2 = nn.Linear(self.DIM, self.CLASSES)

    def forward(self, x):
        h = self.fc1(x)
        if "fp16_exp" in self.plants:
            e = torch.exp(h.half()).float()
        else:
            e = torch.exp(h)
        h = self.act(self.ln(h * torch.sigmoid(e)))
        if "bf16_softmax" in self.plants:
            a = F.softmax(h.bfloat16(), dim=-1).float()
        else:
            a = F.softmax(h, dim=-1)
        return self.fc2(h * a)


def build(plant=None, seed=0):
    """The model with the same initial weights for every plant; `weight` then perturbs fc2."""
    torch.manual_seed(seed)
    model = PlantedNet(plant)
    if "weight" in model.plants:
        with torch.no_grad():
            w = model.fc2.weight
            w[1, 3] += 0.05 * float(w.max() - w.min())
    return model


def batch(seed=1):
    """Inputs large enough that exp(fc1(x)) exceeds float16's range (65504) somewhere."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(6, PlantedNet.IN, generator=gen) * 12.0
    y = torch.randint(0, PlantedNet.CLASSES, (6,), generator=gen)
    return x, y


def dump_run(dump_path, plant=None, task="statistics", level="mix", steps=1, rank=0, exchange=None, wrap=None,
             data_mode=None, input_noise=0.0):
    """Train `steps` SGD steps of the planted model under a PrecisionDebugger writing to
    dump_path/step{N}/rank{rank} (rank=None: the process group's rank).

    task "md5" and `data_mode` (e.g. ["output"]) go through a config.json, as a user would write them.
    `input_noise` multiplies the inputs by (1 + input_noise * N(0, 1)): another device's rounding.

    `exchange(out) -> tensor`, when given, is added (x 1e-3) to the logits before the loss: the
    distributed test passes an all_reduce of the logits there, so every rank's loss depends on all ranks.
    `wrap(model) -> module` (e.g. DistributedDataParallel) is what gets trained.
    """
    model = build(plant)
    if wrap is not None:
        model = wrap(model)
    x, y = batch(seed=1 if rank is None else 1 + rank)
    if input_noise:
        x = x * (1 + input_noise * torch.randn(x.shape, generator=torch.Generator().manual_seed(99)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if task == "md5" or data_mode:  # only a config file can ask for these
        block = {"summary_mode": "md5"} if task == "md5" else {}
        if data_mode:
            block["data_mode"] = data_mode
        real_task = "statistics" if task == "md5" else task
        config = f"{dump_path}.config.json"
        with open(config, "w", encoding="utf-8") as f:
            json.dump({"task": real_task, "dump_path": str(dump_path), "level": level, real_task: block}, f)
        debugger = PrecisionDebugger(config_path=config)
    else:
        debugger = PrecisionDebugger(dump_path=str(dump_path), task=task, level=level)

    def loss_of(x, y):
        out = model(x)
        if exchange is not None:
            out = out + 1e-3 * exchange(out.detach().clone())
        return F.cross_entropy(out, y)

    train_dumped(debugger, model, opt, loss_of, [(x, y)] * steps, rank)
    return str(dump_path)

"""Real PyTorch dumps for the compare tests: a tiny attention + MLP model trained one SGD step under
msprobe's PrecisionDebugger, as a golden fp32 run and as target runs with one planted difference
(a perturbed weight element, or the attention softmax in bfloat16).

Loaded by the `runs` fixture of tests/conftest.py (tests/ has no packages).
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from msprobe.pytorch import PrecisionDebugger, seed_all

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # dumped_training.py lies beside this file, whichever way it was loaded
    sys.path.append(HERE)
from dumped_training import train_dumped  # noqa: E402


class TinyNet(nn.Module):
    """LayerNorm, one attention head (qkv as separate Linears), softmax, GELU MLP, head Linear."""

    def __init__(self, d=16, classes=5, softmax_bf16=False):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.head = nn.Linear(d, classes)
        self.softmax_bf16 = softmax_bf16

    def forward(self, x):
        h = self.ln(x)
        scores = torch.matmul(self.q(h), self.k(h).transpose(-2, -1)) / 4.0
        if self.softmax_bf16:
            attn = F.softmax(scores.to(torch.bfloat16), dim=-1).to(torch.float32)
        else:
            attn = F.softmax(scores, dim=-1)
        h = h + torch.matmul(attn, self.v(h))
        h = h + self.fc2(F.gelu(self.fc1(h)))
        return self.head(h)


VARIANTS = ("fp32", "perturbed", "softmax_bf16")


def build(variant):
    seed_all(1234)
    model = TinyNet(softmax_bf16=variant == "softmax_bf16")
    if variant == "perturbed":
        with torch.no_grad():
            model.fc1.weight[3, 5] += 0.25
    return model


# every dump's intra-op threads: another test in the process may have changed torch's between two dumps
THREADS = torch.get_num_threads()


def dump(root, variant, task, level="mix", steps=1, rank=0):
    """Train `steps` SGD steps of `variant` under a debugger; returns the dump path (`root/...`)."""
    dump_path = os.path.join(str(root), f"{variant}_{task}_{level}_{steps}")
    if os.path.isdir(dump_path):
        return dump_path
    os.makedirs(dump_path)
    real_task = "statistics" if task == "md5" else task
    cfg = {"task": real_task, "level": level, "dump_path": dump_path}
    if task == "md5":
        cfg["statistics"] = {"summary_mode": "md5"}
    cfg_path = os.path.join(dump_path, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    model = build(variant)
    gen = torch.Generator().manual_seed(7)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = ((torch.randn(2, 6, 16, generator=gen), torch.randint(0, 5, (2, 6), generator=gen))
               for _ in range(steps))
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)  # cached runs made at any time round their reductions alike
    try:
        train_dumped(PrecisionDebugger(config_path=cfg_path), model, opt,
                     lambda x, y: F.cross_entropy(model(x).reshape(-1, 5), y.reshape(-1)), batches, rank)
    finally:
        torch.set_num_threads(threads)
    return dump_path


def rank_dir(dump_path, step=0, rank=0):
    return os.path.join(dump_path, f"step{step}", f"rank{rank}")


def dump_json(dump_path, step=0, rank=0):
    return os.path.join(rank_dir(dump_path, step, rank), "dump.json")

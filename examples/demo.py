"""Demo: dump one training step of a small transformer twice — fp32, and a run with one planted
difference (the attention softmax of block 1 computed in bfloat16) — summarise both dumps, compare
them tensor by tensor and name the call where the error is introduced.

    python examples/demo.py --out demo_out
"""

import argparse
import os
import shutil

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.core.compare import compare_dumps
from msprobe.core.diagnosis import diagnose, format_diagnosis
from msprobe.core.dump.summary import format_summary, summarize_dump
from msprobe.pytorch import PrecisionDebugger, seed_all


class Block(nn.Module):
    def __init__(self, d, heads, low_precision_softmax=False):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.low_precision_softmax = low_precision_softmax

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
        if self.low_precision_softmax:  # the planted difference
            attn = F.softmax(scores.to(torch.bfloat16), dim=-1).to(torch.float32)
        else:
            attn = F.softmax(scores, dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyTransformer(nn.Module):
    def __init__(self, vocab=256, d=64, heads=4, layers=2, planted=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, low_precision_softmax=planted and i == 1)
                                    for i in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def train_one_step(dump_path, planted):
    seed_all(1234)
    model = TinyTransformer(planted=planted)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(0, 256, (4, 32))
    debugger = PrecisionDebugger(dump_path=dump_path, task="statistics", level="mix")
    debugger.start(model)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    debugger.stop()
    debugger.step()
    debugger.close()
    return loss.item()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="demo_out", help="output folder (replaced)")
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    runs = {"fp32": False, "planted": True}
    for name, planted in runs.items():
        path = os.path.join(args.out, name)
        loss = train_one_step(path, planted)
        print(f"== {name}: loss {loss:.6f}, dump in {path}")
        print(format_summary(summarize_dump(path), top=3))
    compare_and_diagnose(os.path.join(args.out, "planted"), os.path.join(args.out, "fp32"))


def compare_and_diagnose(target, golden):
    """What `msprobe compare -tp planted -gp fp32` does, from Python."""
    results = compare_dumps(target, golden, progress=False)
    table = results[0].table
    counts = table["Result"].value_counts().to_dict()
    print(f"\n== compare planted vs fp32 ({results[0].mode} mode): {len(table)} rows, "
          + ", ".join(f"{n} {k}" for k, n in counts.items()))
    flagged = table[table["Result"].isin(("error", "warning"))]
    columns = ["NPU Name", "NPU Dtype", "Bench Dtype", "MaxRelativeErr", "NormRelativeErr", "Result"]
    if flagged.empty:
        print("no row is an error or a warning")
    else:
        with pd.option_context("display.width", 200, "display.max_colwidth", 48):
            print(flagged[columns].head(8).to_string(index=False))
    print()
    print(format_diagnosis(diagnose(results)))


if __name__ == "__main__":
    main()

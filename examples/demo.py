"""Demo: dump one training step of a small transformer twice — fp32, and a run with one planted
difference (the attention softmax of block 1 computed in bfloat16) — summarise both dumps, compare
them tensor by tensor and name the call where the error is introduced.

    python examples/demo.py --out demo_out
"""

import argparse
import os
import shutil
import sys

import pandas as pd
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # pytorch_models beside this file
from pytorch_models import Transformer  # noqa: E402

from msprobe.core.compare import compare_dumps  # noqa: E402
from msprobe.core.diagnosis import diagnose, format_diagnosis  # noqa: E402
from msprobe.core.dump.summary import format_summary, summarize_dump  # noqa: E402
from msprobe.pytorch import PrecisionDebugger, seed_all  # noqa: E402


def demo_model(layers=2, planted=False):
    """The example transformer (pytorch_models.py) with 256 tokens, width 64 and `layers` blocks;
    `planted`: block 1's softmax in bfloat16."""
    return Transformer(vocab=256, d=64, heads=4, blocks=layers, seq=32, low_precision_softmax=planted)


def train_one_step(dump_path, planted):
    seed_all(1234)
    model = demo_model(planted=planted)
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

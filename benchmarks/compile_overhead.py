"""Step-time ratio of a torch.compile'd transformer dumped by msprobe against the same compiled model
without the tool, measured in one interleaved run.

One compiled model serves every config: Dynamo keeps a compiled entry for dumped steps (msprobe's mode
on the torch-function stack) beside the one for plain steps, so the configs swap entries without
recompiling. Each config is warmed up first, twice over (compiles are not timed: the second pass
compiles what the other configs' debuggers changed, such as their module hooks); then, for `--rounds` rounds,
every config runs a slot of `--steps` timed training steps, the configs taking turns with a `none`
slot between any two. A timed step with a debugger is

    debugger.start(model); forward + backward + SGD step; debugger.stop(); debugger.step()

The ratio of a config is the median over rounds of (median step time of its slot) / (median step time
of the `none` slots around it). `after_stop` is a debugger that dumped its first step only: its steps
run the plain compiled entry (what the model costs once msprobe is off).

    python benchmarks/compile_overhead.py                    # 5 rounds, all configs (a few minutes: compiles)
    python benchmarks/compile_overhead.py --quick            # CI smoke: 2 rounds, 1 step per slot
    python benchmarks/compile_overhead.py --configs none,stat_L1 --record

Only msprobe's public API is used: `from msprobe.pytorch import PrecisionDebugger`.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from results_file import add_record_option, recording  # noqa: E402

CONFIGS = ("none", "stat_L1", "stat_mix", "stat_L0", "after_stop")


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.softmax(torch.matmul(q, k.transpose(-2, -1)) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj(torch.matmul(att, v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    """Token embedding, pre-LayerNorm blocks, a vocabulary head."""

    def __init__(self, vocab, d, heads, blocks):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(blocks))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


class Runner:
    """One config's debugger (or none) on the shared compiled model."""

    def __init__(self, config, model, compiled, batch, root):
        self.config, self.model, self.compiled, self.batch = config, model, compiled, batch
        self.path = os.path.join(root, config)
        self.debugger = None
        if config.startswith("stat_"):
            self.debugger = PrecisionDebugger(dump_path=self.path, task="statistics", level=config[5:])
        elif config == "after_stop":
            self.debugger = PrecisionDebugger(dump_path=self.path, task="statistics", level="L1", step=[0])
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step(self):
        ids, target = self.batch
        dbg = self.debugger
        if dbg is not None:
            dbg.start(self.compiled)
        logits = self.compiled(ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if dbg is not None:
            dbg.stop()
            dbg.step()
        shutil.rmtree(self.path, ignore_errors=True)  # each step's dump is gone before the next

    def slot(self, steps):
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            self.step()
            times.append(time.perf_counter() - t)
        return statistics.median(times)


def measure(args, log):
    torch.manual_seed(0)
    model = Transformer(args.vocab, args.dim, args.heads, args.blocks)
    compiled = torch.compile(model, fullgraph=args.fullgraph, backend=args.backend)
    gen = torch.Generator().manual_seed(1)
    batch = (torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen),
             torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen))
    root = tempfile.mkdtemp(prefix="msprobe_compile_bench_")
    counters = None
    try:
        runners = {c: Runner(c, model, compiled, batch, root) for c in args.configs}
        base = runners["none"]
        others = [runners[c] for c in args.configs if c != "none"]
        # each config's entry compiles at its first step; a second pass compiles again what the later
        # configs' debuggers changed (their module hooks, installed until close(), are guarded)
        for attempt in range(2):
            for r in [base] + others:
                t = time.perf_counter()
                r.step()
                log(f"warm-up {attempt + 1} {r.config}: {time.perf_counter() - t:.1f} s")
        counters = torch._dynamo.utils.counters  # torch.compile loaded Dynamo
        graphs_before = counters["stats"]["unique_graphs"]
        ratios = {r.config: [] for r in others}
        none_ms = []
        for rnd in range(args.rounds):
            k = rnd % len(others) if others else 0
            before = base.slot(args.steps)
            none_ms.append(before)
            for r in others[k:] + others[:k]:
                got = r.slot(args.steps)
                after = base.slot(args.steps)
                none_ms.append(after)
                ratios[r.config].append(got / statistics.median([before, after]))
                before = after
            log(f"round {rnd + 1}/{args.rounds}: " + "  ".join(f"{c}={v[-1]:.2f}x" for c, v in ratios.items()))
        recompiles = counters["stats"]["unique_graphs"] - graphs_before
        for r in others:
            r.debugger.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"none_ms": 1e3 * statistics.median(none_ms), "recompiles_while_timed": recompiles,
            "graph_breaks": sum(counters["graph_break"].values()) if counters is not None else None,
            "configs": {c: {"ratio": statistics.median(v), "round_ratios": v} for c, v in ratios.items()}}


def render(results, args):
    lines = [f"compiled transformer ({args.blocks} blocks, d {args.dim}, seq {args.seq}, batch {args.batch}, "
             f"backend {args.backend}{', fullgraph' if args.fullgraph else ''}), CPU, {torch.get_num_threads()} "
             f"threads, torch {torch.__version__}",
             f"{'config':<12}{'ratio':>8}  per-round",
             f"{'none':<12}{results['none_ms']:>6.1f} ms"]
    for c, e in results["configs"].items():
        rr = e["round_ratios"]
        lines.append(f"{c:<12}{e['ratio']:>7.2f}x  ({min(rr):.2f}-{max(rr):.2f})")
    lines.append("ratio: median over rounds of (config step time / neighbouring none step time), wall clock")
    lines.append(f"Dynamo graphs compiled while timed: {results['recompiles_while_timed']}; "
                 f"graph breaks in the run: {results['graph_breaks']}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="round-robin rounds (default 5)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per config per round (default 3)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    p.add_argument("--fullgraph", action="store_true", help="torch.compile(fullgraph=True)")
    p.add_argument("--blocks", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--dim", type=int, default=128, help="model width (default 128)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--quick", action="store_true", help="CI smoke: --rounds 2 --steps 1")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    add_record_option(p)
    args = p.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        p.error(f"--configs: unknown {bad}; choose from {', '.join(CONFIGS)}")
    args.configs = ["none"] + [c for c in configs if c != "none"]
    if args.quick:
        args.rounds, args.steps = 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("MSPROBE_QUIET", "1")

    def log(msg):
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    results = measure(args, log)
    with recording("compile_overhead.py", args.record, argv):
        print(render(results, args))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

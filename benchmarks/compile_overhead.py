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
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from msprobe.pytorch import PrecisionDebugger

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (beside this script: the interleaved rounds, ratios and common options)
from models import Transformer  # noqa: E402

CONFIGS = ("none", "stat_L1", "stat_mix", "stat_L0", "after_stop")


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
        return harness.timed_steps(self.step, steps)


def measure(args, log):
    torch.manual_seed(0)
    model = Transformer(vocab=args.vocab, d_model=args.dim, n_heads=args.heads, n_blocks=args.blocks, seq=args.seq)
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

        def on_round(rnd, per_config):
            log(f"round {rnd + 1}/{args.rounds}: " + "  ".join(
                f"{c}={harness.ratios(v[-1:], v[-1][1])['ratio']:.2f}x" for c, v in per_config.items()))

        per_config, base_all, _ = harness.interleave(
            lambda: base.slot(args.steps), {r.config: (lambda r=r: r.slot(args.steps)) for r in others},
            args.rounds, on_round=on_round)
        recompiles = counters["stats"]["unique_graphs"] - graphs_before
        for r in others:
            r.debugger.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"none_ms": 1e3 * statistics.median(s[0] for s in base_all), "recompiles_while_timed": recompiles,
            "graph_breaks": sum(counters["graph_break"].values()) if counters is not None else None,
            "configs": {c: {k: v for k, v in harness.ratios(rounds, base_all).items()
                            if k in ("ratio", "round_ratios")} for c, rounds in per_config.items()}}


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
    harness.add_common_options(p, rounds=5, steps=3)
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, from {', '.join(CONFIGS)}")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    p.add_argument("--fullgraph", action="store_true", help="torch.compile(fullgraph=True)")
    p.add_argument("--blocks", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--dim", type=int, default=128, help="model width (default 128)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    args = p.parse_args(argv)
    harness.check_common_options(p, args)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        p.error(f"--configs: unknown {bad}; choose from {', '.join(CONFIGS)}")
    args.configs = ["none"] + [c for c in configs if c != "none"]
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("MSPROBE_QUIET", "1")

    results = measure(args, harness.logger(args.quiet))
    print(render(results, args))
    harness.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("compile_overhead.py", main))

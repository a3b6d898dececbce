"""Step-time overhead of grad_probe (PyTorch) against no monitoring, measured in one interleaved run.

Each level (L0: statistics + CRC-32 of every gradient, L1: statistics + sign bitmaps, L2: L1 + interval
shares) gets its own copy of the workload and its own GradientMonitor. A round is
`none, c1, none, c2, none, c3, none` with the order of c1..c3 rotated each round; a slot is `--steps`
training steps (forward, backward, SGD step) plus draining the monitor's writer, so the files written
in the background are paid for in the slot that made them. The ratio of a level is the median over
rounds of (slot time / mean of the two neighbouring `none` slots); `cpu` is the same for process CPU
time (all threads, so the writer's work counts). On a shared, loaded machine those ratios swing by tens
of percent from round to round, so the cost is also measured directly: `hook ms` is the wall time per
step the training thread spends in the optimizer pre-hook reading the gradients, `writer ms` the CPU
time per step of the writer thread, and `1+added` = 1 + (hook + writer) / median `none` step time.

    python benchmarks/grad_probe_overhead.py                         # transformer, 7 rounds
    python benchmarks/grad_probe_overhead.py --models transformer,mlp --rounds 9
    python benchmarks/grad_probe_overhead.py --device cuda           # on a GPU
    python benchmarks/grad_probe_overhead.py --quick                 # CI smoke: 2 rounds, 1 step
    python benchmarks/grad_probe_overhead.py --check                 # exit 1 when L1 misses 1.05

The workloads (the transformer, MLP and CNN) are benchmarks/models.py's, as in dump_overhead.py.
"""

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (beside this script: the interleaved rounds, ratios and common options)
from models import MODELS, Workload  # noqa: E402

from msprobe.core.grad_probe.config import grad_probe_config_from_dict  # noqa: E402
from msprobe.pytorch.grad_probe import GradientMonitor  # noqa: E402

LEVELS = ("L0", "L1", "L2")
TARGETS = {"L1": 1.05}


class Slotted:
    """One workload, optionally monitored at one level."""

    def __init__(self, model_name, level, root, device):
        self.level = level
        self.work = Workload(model_name, device)
        self.monitor = None
        if level != "none":
            cfg = grad_probe_config_from_dict({"task": "grad_probe", "dump_path": os.path.join(root, level),
                                               "grad_probe": {"grad_level": level}})
            self.monitor = GradientMonitor(config=cfg)
            self.monitor.monitor(self.work.model)
            reduce = self.monitor._reducer.reduce

            def timed_reduce(grads):  # the training thread's share: reading the gradients at the hook
                t = time.perf_counter()
                try:
                    return reduce(grads)
                finally:
                    self.hook_seconds += time.perf_counter() - t
            self.monitor._reducer.reduce = timed_reduce
            write = self.monitor._writer._write

            def timed_write(*a):  # the writer thread's CPU time: it competes with training for cores
                t = time.thread_time()
                try:
                    return write(*a)
                finally:
                    self.writer_seconds += time.thread_time() - t
            self.monitor._writer._write = timed_write
        self.hook_seconds = 0.0
        self.writer_seconds = 0.0
        self.hook_steps = 0

    def slot(self, steps):
        """One sample: (wall, cpu) seconds per step over `steps` steps plus draining the writer."""
        def run():
            for _ in range(steps):
                self.work.train_step()
            self.work.sync()
            if self.monitor is not None:
                self.monitor._writer.flush()
        gc.collect()
        wall, cpu = harness.timed(run)
        self.hook_steps += steps
        return [(wall / steps, cpu / steps)]

    def close(self):
        if self.monitor is not None:
            self.monitor.close()


def measure(model_name, levels, rounds, steps, root, device, log):
    base = Slotted(model_name, "none", root, device)
    runs = {lv: Slotted(model_name, lv, root, device) for lv in levels}
    for r in [base, *runs.values()]:  # warm-up: allocator, thread pool, first files
        r.slot(1)

    def on_round(rnd, per_config):
        log(f"[{model_name}] round {rnd + 1}/{rounds}: none={1e3 * per_config[levels[0]][-1][1][-1][0]:.1f}ms  " +
            "  ".join(f"{lv}={harness.ratios(per_config[lv][-1:], per_config[lv][-1][1])['ratio']:.3f}"
                      for lv in levels))

    per_level, base_all, _ = harness.interleave(
        lambda: base.slot(steps), {lv: (lambda r=r: r.slot(steps)) for lv, r in runs.items()}, rounds,
        on_round=on_round)
    for r in runs.values():
        r.close()
    hook_ms = {lv: 1e3 * r.hook_seconds / max(r.hook_steps, 1) for lv, r in runs.items()}
    writer_ms = {lv: 1e3 * r.writer_seconds / max(r.hook_steps, 1) for lv, r in runs.items()}
    none_ms = 1e3 * statistics.median(s[0] for s in base_all)
    out = {"none_median_ms": none_ms, "levels": {}}
    for lv in levels:
        wall, cpu = harness.ratios(per_level[lv], base_all), harness.ratios(per_level[lv], base_all, harness.CPU)
        out["levels"][lv] = {"ratio": wall["ratio"], "cpu_ratio": cpu["ratio"], "hook_ms": hook_ms[lv],
                             "writer_cpu_ms": writer_ms[lv], "added_ratio": 1 + (hook_ms[lv] + writer_ms[lv]) / none_ms,
                             "round_ratios": [round(x, 4) for x in wall["round_ratios"]]}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_options(ap, rounds=7, steps=4)
    ap.add_argument("--models", default="transformer", type=lambda v: harness.parse_list(v, MODELS, "model"),
                    help=f"comma list of {', '.join(MODELS)} (default transformer)")
    ap.add_argument("--levels", default=",".join(LEVELS), type=lambda v: harness.parse_list(v, LEVELS, "level"),
                    help=f"comma list of {', '.join(LEVELS)} (default all)")
    ap.add_argument("--device", default="cpu", help="where the model trains (default cpu)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a level misses its target")
    args = ap.parse_args(argv)
    harness.check_common_options(ap, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    levels = args.levels
    results = {}
    with tempfile.TemporaryDirectory(prefix="grad_probe_bench_") as root:
        for m in args.models:
            results[m] = measure(m, levels, args.rounds, args.steps, root, args.device, harness.logger(args.quiet))
    print(f"grad_probe overhead: step time with monitoring / without (median of {args.rounds} interleaved "
          f"rounds, {args.steps} steps per slot, device {args.device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)")
    print(f"{'model':<12} {'level':<6} {'none ms':>9} {'wall ratio':>10} {'cpu ratio':>9} {'hook ms':>8} "
          f"{'writer ms':>9} {'1+added':>8}")
    failed = []
    for m, res in results.items():
        for lv in levels:
            r = res["levels"][lv]
            print(f"{m:<12} {lv:<6} {res['none_median_ms']:>9.1f} {r['ratio']:>10.3f} {r['cpu_ratio']:>9.3f} "
                  f"{r['hook_ms']:>8.2f} {r['writer_cpu_ms']:>9.2f} {r['added_ratio']:>8.4f}")
            if lv in TARGETS and r["ratio"] > TARGETS[lv]:
                failed.append(f"{m} {lv}: {r['ratio']:.3f} > {TARGETS[lv]}")
    print("targets: " + ", ".join(f"{lv} <= {t}" for lv, t in TARGETS.items()))
    harness.write_json(args.json, results)
    if failed:
        print("MISSED: " + "; ".join(failed))
        return 1 if args.check else 0
    return 0


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("grad_probe_overhead.py", main))

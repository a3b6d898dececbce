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

The workloads (the transformer, MLP and CNN) are those of benchmarks/dump_overhead.py.
"""

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump_overhead import Workload  # noqa: E402

from msprobe.core.grad_probe.config import grad_probe_config_from_dict  # noqa: E402
from msprobe.pytorch.grad_probe import GradientMonitor  # noqa: E402

LEVELS = ("L0", "L1", "L2")
TARGETS = {"L1": 1.05}


class Slotted:
    """One workload, optionally monitored at one level."""

    def __init__(self, model_name, level, root, device):
        self.level = level
        self.work = Workload(model_name)
        if device != "cpu":
            self.work.model.to(device)
            self.work.x, self.work.y = self.work.x.to(device), self.work.y.to(device)
            self.work.opt = torch.optim.SGD(self.work.model.parameters(), lr=1e-3)
        self.device = device
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
        """(wall, cpu) seconds per step over `steps` steps plus draining the writer."""
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            self.work.train_step()
        self.hook_steps += steps
        if self.device != "cpu":
            torch.cuda.synchronize()
        if self.monitor is not None:
            self.monitor._writer.flush()
        return (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps

    def close(self):
        if self.monitor is not None:
            self.monitor.close()


def measure(model_name, levels, rounds, steps, root, device, log):
    base = Slotted(model_name, "none", root, device)
    runs = [Slotted(model_name, lv, root, device) for lv in levels]
    for r in [base] + runs:  # warm-up: allocator, thread pool, first files
        r.slot(1)
    ratios = {lv: {"wall": [], "cpu": []} for lv in levels}
    base_times = []
    for rnd in range(rounds):
        k = rnd % len(runs)
        order = runs[k:] + runs[:k]
        before = base.slot(steps)
        base_times.append(before[0])
        for r in order:
            got = base_slot = None
            got = r.slot(steps)
            base_slot = base.slot(steps)
            base_times.append(base_slot[0])
            for i, key in enumerate(("wall", "cpu")):
                ratios[r.level][key].append(got[i] / ((before[i] + base_slot[i]) / 2))
            before = base_slot
        log(f"[{model_name}] round {rnd + 1}/{rounds}: none={1e3 * before[0]:.1f}ms  " +
            "  ".join(f"{lv}={ratios[lv]['wall'][-1]:.3f}" for lv in levels))
    for r in runs:
        r.close()
    hook_ms = {r.level: 1e3 * r.hook_seconds / max(r.hook_steps, 1) for r in runs}
    writer_ms = {r.level: 1e3 * r.writer_seconds / max(r.hook_steps, 1) for r in runs}
    none_ms = 1e3 * statistics.median(base_times)
    return {"none_median_ms": none_ms,
            "levels": {lv: {"ratio": statistics.median(v["wall"]), "cpu_ratio": statistics.median(v["cpu"]),
                            "hook_ms": hook_ms[lv], "writer_cpu_ms": writer_ms[lv],
                            "added_ratio": 1 + (hook_ms[lv] + writer_ms[lv]) / none_ms,
                            "round_ratios": [round(x, 4) for x in v["wall"]]}
                       for lv, v in ratios.items()}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="transformer")
    ap.add_argument("--levels", default=",".join(LEVELS))
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    levels = [lv for lv in args.levels.split(",") if lv]
    results = {}
    with tempfile.TemporaryDirectory(prefix="grad_probe_bench_") as root:
        for m in args.models.split(","):
            results[m] = measure(m, levels, args.rounds, args.steps, root, args.device,
                                 lambda s: print(s, file=sys.stderr, flush=True))
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if failed:
        print("MISSED: " + "; ".join(failed))
        return 1 if args.check else 0
    return 0


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("grad_probe_overhead.py", main))

"""Step-time overhead of msprobe's TrainerMon (PyTorch) against no monitor, measured in one interleaved run.

The workload is the transformer of `benchmarks/models.py` (4 blocks, d_model 256, batch 4x128)
trained with AdamW. Configs:

    none    no monitor (the baseline)
    full    activations (forward and backward), weight gradients before and after reduction, optimizer
            moments, parameters before and after the step; ops norm, min, max, mean, zeros, nans;
            AnomalyTurbulence + AnomalyNan alerts with anomaly dump; csv output
    gnorm   weight-gradient norms only (wg_distribution, ops [norm]); csv output

Every config has its own model and optimizer (same seed). A round is `none, c1, none, c2, none`
(`--steps` timed steps per slot, the order of c1..cN rotated each round); a config's ratio is the median
over rounds of (its median step time) / (median step time of the `none` slots right before and after it),
so load bursts from other processes hit both sides. CPU-time ratios (all threads) are printed too.

    python benchmarks/monitor_overhead.py                    # 7 rounds x 3 steps
    python benchmarks/monitor_overhead.py --quick            # smoke run (2 rounds x 1 step)
    python benchmarks/monitor_overhead.py --check            # exit 1 when a ratio misses its target
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (beside this script: the interleaved rounds, ratios and common options)
from models import Workload  # noqa: E402  (the same transformer as the dump benchmark)

from msprobe.pytorch import TrainerMon  # noqa: E402

CONFIGS = {
    "full": {"xy_distribution": True, "wg_distribution": True, "mv_distribution": True,
             "param_distribution": True, "ops": ["norm", "min", "max", "mean", "zeros", "nans"],
             "format": "csv",
             "alert": {"rules": [{"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}},
                                 {"rule_name": "AnomalyNan", "args": {"threshold": 1e10}}], "dump": True}},
    "gnorm": {"wg_distribution": True, "ops": ["norm"], "format": "csv"},
}
TARGETS = {"full": 1.5, "gnorm": 1.05}
MSPROBE = {"full": "5.3-6.4x", "gnorm": "1.32x"}


class Runner:
    def __init__(self, name, root):
        self.name = name
        self.work = Workload("transformer")
        self.work.opt = torch.optim.AdamW(self.work.model.parameters(), lr=1e-4)
        self.mon = None
        if name != "none":
            cfg_path = os.path.join(root, f"{name}.json")
            with open(cfg_path, "w", encoding="utf-8") as f:
                json.dump(CONFIGS[name], f)
            os.environ["MONITOR_OUTPUT_DIR"] = os.path.join(root, name)
            self.mon = TrainerMon(cfg_path)
            self.mon.set_monitor(self.work.model, 1, self.work.opt)

    def slot(self, steps):
        return harness.timed_steps(self.work.train_step, steps)


def measure(names, rounds, steps, root, log):
    base = Runner("none", root)
    runners = {n: Runner(n, root) for n in names}
    for r in [base, *runners.values()]:  # warm-up: allocator, first-step optimizer state, file creation
        r.slot(2)

    def on_round(rnd, per_config):
        latest = {n: harness.ratios(per_config[n][-1:], per_config[n][-1][1])["ratio"] for n in names}
        log(f"round {rnd + 1}/{rounds}: " + "  ".join(f"{n}={r:.3f}x" for n, r in latest.items()))

    per_config, base_all, _ = harness.interleave(
        lambda: base.slot(steps), {n: (lambda r=r: r.slot(steps)) for n, r in runners.items()}, rounds,
        on_round=on_round)
    for r in runners.values():
        r.mon.close()
    paired = {}
    for n in names:
        wall, cpu = harness.ratios(per_config[n], base_all), harness.ratios(per_config[n], base_all, harness.CPU)
        paired[n] = {"wall": wall["round_ratios"], "cpu": cpu["round_ratios"], "min": wall["ratio_of_mins"]}
    return paired


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_options(p, rounds=7, steps=3)
    p.add_argument("--configs", default="full,gnorm", type=lambda v: harness.parse_list(v, CONFIGS, "config"),
                   help=f"comma list of {', '.join(CONFIGS)}")
    p.add_argument("--check", action="store_true", help="exit 1 when a ratio is over its target")
    args = p.parse_args(argv)
    harness.check_common_options(p, args)
    names = args.configs
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="monitor_bench_") as root:
        paired = measure(names, args.rounds, args.steps, root, harness.logger(args.quiet))
    med = statistics.median
    print(f"\n{'config':<8}{'wall ratio':>12}{'(round range)':>18}{'cpu ratio':>11}{'min ratio':>11}{'target':>9}"
          f"{'msProbe':>10}")
    misses = []
    for n in names:
        w, c = paired[n]["wall"], paired[n]["cpu"]
        mark = "!" if med(w) > TARGETS[n] else " "
        print(f"{n:<8}{med(w):>11.3f}x{mark}{f'({min(w):.2f}-{max(w):.2f})':>17}{med(c):>10.3f}x"
              f"{paired[n]['min']:>10.3f}x{'<=' + format(TARGETS[n], 'g'):>9}{MSPROBE[n]:>10}")
        if med(w) > TARGETS[n]:
            misses.append(f"{n}: {med(w):.3f}x > {TARGETS[n]}x")
    print("wall ratio: median over rounds of (config median step / neighbouring none median step); !: over target;\n"
          "cpu ratio: the same with process CPU time; min ratio: fastest config step / fastest none step")
    harness.write_json(args.json, {n: {"wall_ratio": med(paired[n]["wall"]), "cpu_ratio": med(paired[n]["cpu"]),
                                       "min_ratio": paired[n]["min"], "round_wall_ratios": paired[n]["wall"]}
                                   for n in names})
    if args.check and misses:
        print("over target: " + "; ".join(misses))
        return 1
    return 0


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("monitor_overhead.py", main))

"""What l0_floor.py and ms_l0_floor.py share: the interleaved rounds and the command line.

Each round runs one step of every config, in an order rotated each round; a config's ratio is the
median over rounds of its step time over that round's `none` step (single steps alternate: none of
these configs leaves background work to the next step). Framework-free.
"""

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time


class FloorProbe:
    """Base of the scripts' hook probes: start(model) installs hooks into `_handles`, their reads go to
    `results` (with `read`), step() removes the hooks. Used as a debugger: start, stop, step."""

    def __init__(self, read, kernel_enabled, script):
        if read and not kernel_enabled:
            raise SystemExit(f"{script}: msprobe's statistics kernel is not built (MSPROBE_NATIVE_STATS=0?)")
        self.read = read
        self.results = []
        self._handles = []

    def stop(self):
        pass

    def step(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        self.results = []


def interleave(configs, one_step, rounds, log, label):
    """Time `one_step(config)` (seconds) for every config, two warm-up steps each, then `rounds` rounds.
    `configs[0]` is the baseline. Returns base_ms and, per config, ratios and added_ms (medians)."""
    for config in configs:
        one_step(config)
        one_step(config)
    times = {c: [] for c in configs}
    for rnd in range(rounds):
        for config in configs[rnd % len(configs):] + configs[:rnd % len(configs)]:
            times[config].append(one_step(config))
        if (rnd + 1) % 10 == 0:
            log(f"[{label}] round {rnd + 1}/{rounds}")
    base = times[configs[0]]
    return {"base_ms": 1e3 * statistics.median(base),
            "ratios": {c: statistics.median(t / b for t, b in zip(times[c], base)) for c in configs},
            "added_ms": {c: 1e3 * statistics.median(t - b for t, b in zip(times[c], base)) for c in configs}}


def measure_probes(probes, run_step, dump_path, rounds, log, label):
    """`interleave` over `probes` ({config: probe}, in config order, "none": None; those with a
    close(), msprobe's debuggers, are closed at the end); `run_step(probe)` is one training step with
    `probe` started before and stopped and stepped after it. msprobe's dumps under `dump_path` are
    removed after each step, outside the timed part."""
    def one_step(config):
        gc.collect()
        t0 = time.perf_counter()
        run_step(probes[config])
        took = time.perf_counter() - t0
        shutil.rmtree(dump_path, ignore_errors=True)
        return took

    try:
        return interleave(tuple(probes), one_step, rounds, log, label)
    finally:
        for probe in probes.values():
            if hasattr(probe, "close"):
                probe.close()


def main(description, models, configs, measure, title, json_extra, argv=None):
    """The scripts' command line: `measure(model, rounds, tmp_dir, log)` per model, a table, --json."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--models", default=",".join(models), help=f"comma-separated, from {', '.join(models)}")
    ap.add_argument("--rounds", type=int, default=30, help="steps of each config (default 30)")
    ap.add_argument("--json", help="also write the numbers to this file")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)
    chosen = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in chosen:
        if m not in models:
            ap.error(f"--models: unknown model {m!r}; choose from {', '.join(models)}")
    if args.rounds < 1:
        ap.error(f"--rounds: {args.rounds}; must be >= 1")
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    tmp = tempfile.mkdtemp(prefix="msprobe-floor-")
    try:
        results = {m: measure(m, args.rounds, tmp, log) for m in chosen}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{title}: step time / no tool (median of {args.rounds} rounds); added ms in brackets")
    print(f"{'model':<12} {'base ms':>8} " + " ".join(f"{c:>16}" for c in configs[1:]))
    for m, r in results.items():
        cells = " ".join(f"{r['ratios'][c]:>7.3f} ({r['added_ms'][c]:+5.2f})" for c in configs[1:])
        print(f"{m:<12} {r['base_ms']:>8.1f} {cells}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rounds": args.rounds, **json_extra, "results": results}, f, indent=1)

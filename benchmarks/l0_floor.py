"""How close msprobe's L0 statistics dump is to the least any module-hook dump has to do.

The issue puts the floor of a dump at "reading each captured tensor once". This script measures that
floor on the models of dump_overhead.py, in one interleaved run, beside msprobe itself:

    none      no tool
    hooks     the hooks an L0 dump needs, doing nothing: a forward hook on every submodule, a hook on
              the autograd node of each module output, a post-accumulate-grad hook on every parameter
    floor     the same hooks, each reading its tensors once with msprobe's one-pass statistics kernel
              (module outputs, the module's own parameters, the gradients of the outputs, parameter
              gradients: what an L0 record holds that no other record already read); the four numbers
              go to a list, and nothing else happens: no keys, no records, no files, no backward
              bookkeeping
    stat_L0   msprobe: PrecisionDebugger(task="statistics", level="L0"), start/stop/step

`stat_L0 - floor` is what msprobe's records cost on top of reading the data: names, filters, record
dicts, dump.json/construct.json appends, the walk that finds each module's backward.

    python benchmarks/l0_floor.py                  # 3 models, 30 rounds (about 2 minutes)
    python benchmarks/l0_floor.py --models cnn --rounds 60 --json floor.json

Each round runs one step of every config, in an order rotated each round; a config's ratio is the
median over rounds of its step time over that round's `none` step. Single steps alternate here (no
slots as in dump_overhead.py): none of these configs leaves background work to the next step.
Uses msprobe internals (the statistics kernel), unlike dump_overhead.py.
"""

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump_overhead import MODELS, Workload  # noqa: E402  (the same models and training step)

from msprobe.core.dump import moments  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402
from msprobe.pytorch.statistics import _PARALLEL_MIN  # noqa: E402  (msprobe's split: the same threads here)

CONFIGS = ("none", "hooks", "floor", "stat_L0")


class HookFloor:
    """The hooks of an L0 dump; with `read`, each reads its tensors once with the statistics kernel."""

    def __init__(self, read):
        if read and not moments.ENABLED:
            raise SystemExit("l0_floor.py: msprobe's statistics kernel is not built (MSPROBE_NATIVE_STATS=0?)")
        self.read = read
        self.results = []
        self._handles = []

    def _stats(self, t):
        if not self.read:
            return
        if t.dtype is torch.float32 and t.is_contiguous() and t.numel():
            n = t.numel()
            self.results.append(moments._moments(t.data_ptr(), n, moments.KINDS["float32"],
                                                 torch.get_num_threads() if n >= _PARALLEL_MIN else 1))
        else:  # not in these models' L0 records; counted, not read
            self.results.append(None)

    def start(self, model):
        for name, mod in model.named_modules():
            if name:
                self._handles.append(mod.register_forward_hook(self._forward))
        for p in model.parameters():
            self._handles.append(p.register_post_accumulate_grad_hook(lambda p: self._stats(p.grad)))

    def _forward(self, mod, args, out):
        with torch.no_grad():
            for o in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(o, torch.Tensor):
                    self._stats(o.detach())
                    if o.grad_fn is not None:
                        o.grad_fn.register_hook(self._backward)
            for p in mod._parameters.values():
                if p is not None:
                    self._stats(p.detach())

    def _backward(self, grad_inputs, grad_outputs):
        for g in grad_outputs:  # the gradients of the module's outputs; those of its inputs are the
            if g is not None:   # next module's output gradients (or the first module's input's: none)
                self._stats(g)

    def stop(self):
        pass

    def step(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        self.results = []


def measure(model_name, rounds, tmp, log):
    work = Workload(model_name)
    dump_path = os.path.join(tmp, model_name)
    probes = {"none": None, "hooks": HookFloor(read=False), "floor": HookFloor(read=True),
              "stat_L0": PrecisionDebugger(task="statistics", level="L0", dump_path=dump_path)}

    def one_step(config):
        probe = probes[config]
        gc.collect()
        t0 = time.perf_counter()
        if probe is not None:
            probe.start(work.model)
        work.train_step()
        if probe is not None:
            probe.stop()
            probe.step()
        took = time.perf_counter() - t0
        if config == "stat_L0":
            shutil.rmtree(dump_path, ignore_errors=True)
        return took

    for config in CONFIGS:  # warm-up
        one_step(config)
        one_step(config)
    times = {c: [] for c in CONFIGS}
    for rnd in range(rounds):
        order = CONFIGS[rnd % len(CONFIGS):] + CONFIGS[:rnd % len(CONFIGS)]
        for config in order:
            times[config].append(one_step(config))
        if (rnd + 1) % 10 == 0:
            log(f"[{model_name}] round {rnd + 1}/{rounds}")
    probes["stat_L0"].close()
    base = times["none"]
    ratios = {c: statistics.median(t / b for t, b in zip(times[c], base)) for c in CONFIGS}
    return {"base_ms": 1e3 * statistics.median(base), "ratios": ratios,
            "added_ms": {c: 1e3 * statistics.median(t - b for t, b in zip(times[c], base)) for c in CONFIGS}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--rounds", type=int, default=30, help="steps of each config (default 30)")
    ap.add_argument("--json", help="also write the numbers to this file")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            ap.error(f"--models: unknown model {m!r}; choose from {', '.join(MODELS)}")
    if args.rounds < 1:
        ap.error(f"--rounds: {args.rounds}; must be >= 1")
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
    tmp = tempfile.mkdtemp(prefix="msprobe-floor-")
    try:
        results = {m: measure(m, args.rounds, tmp, log) for m in models}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"L0 statistics: step time / no tool (median of {args.rounds} rounds); added ms in brackets")
    print(f"{'model':<12} {'base ms':>8} " + " ".join(f"{c:>16}" for c in CONFIGS[1:]))
    for m, r in results.items():
        cells = " ".join(f"{r['ratios'][c]:>7.3f} ({r['added_ms'][c]:+5.2f})" for c in CONFIGS[1:])
        print(f"{m:<12} {r['base_ms']:>8.1f} {cells}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rounds": args.rounds, "threads": torch.get_num_threads(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

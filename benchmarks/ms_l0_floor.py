"""How close msprobe's MindSpore L0 statistics dump is to the least any Cell-hook dump has to do.

The MindSpore twin of l0_floor.py, on the models of ms_dump_overhead.py, in its synchronous process
(`pynative_synchronize` set before the first op: the strict baseline), in one interleaved run:

    none      no tool
    hooks     the hooks an L0 dump needs, doing nothing: a forward hook on every sub-Cell, a tensor
              hook on each Cell output (its gradient) and on every trainable Parameter (its gradient)
    floor     the same hooks, each reading its tensors once with msprobe's one-pass statistics kernel
              (Cell outputs, the Cell's own Parameters, the gradients of the outputs, the Parameter
              gradients: what an L0 record holds that no other record already read); the four
              numbers go to a list, and nothing else happens: no keys, no records, no files
    late      the same hooks holding their tensors, all read at stop(): msprobe too reads gradients in
              a batch after backward (and parameters at start()), and one batch of `asnumpy()` calls
              costs less than the same calls spread between the step's ops (a lower bound: a tensor
              changed in place after its hook would be read wrong)
    stat_L0   msprobe: PrecisionDebugger(task="statistics", level="L0"), start/stop/step

What the floor leaves out and an L0 record needs in MindSpore: the gradient each Cell's inputs get
through that Cell (backward `output`). MindSpore hands a tensor hook the total gradient of a tensor, so
msprobe passes each Cell input through a stand-in (a view with a tensor hook, ~9 us a use, forward and
backward) to see that Cell's share; `stat_L0 - floor` counts them with names, records and files.

    python benchmarks/ms_l0_floor.py                  # 3 models, 30 rounds (about 1 minute)
    python benchmarks/ms_l0_floor.py --models transformer --rounds 60 --json floor.json

Each round runs one step of every config, in an order rotated each round; a config's ratio is the
median over rounds of its step time over that round's `none` step. Uses msprobe internals (the
statistics kernel), unlike ms_dump_overhead.py.
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

os.environ.setdefault("GLOG_v", "3")  # MindSpore's deprecation warnings: errors only
os.environ["MSPROBE_BENCH_EXECUTION"] = "synchronous"  # read by ms_dump_overhead before any op runs
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ms_dump_overhead import MODELS, Runner  # noqa: E402  (the same models and training step)

import mindspore as ms  # noqa: E402

from msprobe.core.dump import moments  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402
from msprobe.mindspore.statistics import host_view  # noqa: E402  (msprobe's zero-copy read)

CONFIGS = ("none", "hooks", "floor", "late", "stat_L0")


class CellHookFloor:
    """The hooks of an L0 dump; with `read`, each reads its tensors once with the statistics kernel."""

    def __init__(self, read, late=False):
        if read and not moments.ENABLED:
            raise SystemExit("ms_l0_floor.py: msprobe's statistics kernel is not built (MSPROBE_NATIVE_STATS=0?)")
        self.read = read
        self.late = late  # hold the tensors, read them at stop()
        self.held = []
        self.results = []
        self._handles = []

    def _stats(self, t):
        if not self.read:
            return
        if self.late:
            self.held.append(t)
            return
        self._read(t)

    def _read(self, t):
        a = host_view(t)
        if a.dtype.kind == "f" and a.dtype.itemsize == 4 and a.flags.c_contiguous and a.size:
            self.results.append(moments.moments(a.__array_interface__["data"][0], a.size, moments.KINDS["float32"]))
        else:  # not in these models' L0 records; counted, not read
            self.results.append(None)

    def _on_grad(self, grad):
        self._stats(grad)

    def start(self, model):
        for _, cell in model.cells_and_names():
            if cell is not model:
                self._handles.append(cell.register_forward_hook(self._forward))
        for p in model.trainable_params():
            self._handles.append(p.register_hook(self._on_grad))

    def _forward(self, cell, args, out):
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, ms.Tensor):
                self._stats(o)
                try:
                    o.register_hook(self._on_grad)
                except (RuntimeError, TypeError, ValueError):  # a tensor that takes no gradient
                    pass
        for p in cell.get_parameters(expand=False):
            self._stats(p)

    def stop(self):
        for t in self.held:
            self._read(t)
        self.held = []

    def step(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        self.results = []


def measure(model_name, rounds, tmp, log):
    runner = Runner(model_name)
    dump_path = os.path.join(tmp, model_name)
    probes = {"none": None, "hooks": CellHookFloor(read=False), "floor": CellHookFloor(read=True),
              "late": CellHookFloor(read=True, late=True),
              "stat_L0": PrecisionDebugger(task="statistics", level="L0", dump_path=dump_path)}

    def one_step(config):
        gc.collect()
        t0 = time.perf_counter()
        runner.step(probes[config])
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
    tmp = tempfile.mkdtemp(prefix="msprobe-ms-floor-")
    try:
        results = {m: measure(m, args.rounds, tmp, log) for m in models}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"MindSpore L0 statistics, synchronous PyNative: step time / no tool (median of {args.rounds} rounds);"
          " added ms in brackets")
    print(f"{'model':<12} {'base ms':>8} " + " ".join(f"{c:>16}" for c in CONFIGS[1:]))
    for m, r in results.items():
        cells = " ".join(f"{r['ratios'][c]:>7.3f} ({r['added_ms'][c]:+5.2f})" for c in CONFIGS[1:])
        print(f"{m:<12} {r['base_ms']:>8.1f} {cells}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rounds": args.rounds, "execution": "synchronous", "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

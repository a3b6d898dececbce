"""The statistics kernel's loops (msprobe._moments: portable, AVX2, AVX-512) against each other, in one run.

Two tables:

1. Read speed: GB/s of one call on a dense tensor, by dtype and size, each loop in turn within a round
   (median over rounds), and torch's own reductions (aminmax, sum, sum of squares: what a dump without the
   kernel costs) beside them. A tensor a dump reads was usually just written, so sizes up to the caches
   are read from them; the largest ones come from memory.
2. Steps: a dumped training step's extra time with each loop in turn (one debugger per model and level,
   its dumped steps taking the loops in turn, each followed by a plain step), on dump_overhead.py's models
   (`--models llama,gpt2,opt`: its untuned half).
   The ratio is each loop's extra time over the widest loop's.

    python benchmarks/stats_kernel.py                 # --record: into RESULTS.md
    python benchmarks/stats_kernel.py --quick         # CI smoke
"""

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

from msprobe.core.dump import moments
from msprobe.pytorch import PrecisionDebugger

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (beside this script)
from models import CPU_MODELS, UNTUNED_MODELS, Workload  # noqa: E402

SIZES = (4096, 65536, 262144, 1 << 20, 4 << 20)
DTYPES = {"float32": (torch.float32, 0), "bfloat16": (torch.bfloat16, 2)}
LEVELS = ("L0", "L1")
READ_SECONDS = 0.02  # a timing of one loop on one tensor lasts about this long


def _read_seconds(fn, n_bytes):
    """Seconds a call of `fn` takes (the best of 3 batches of calls, each about READ_SECONDS long)."""
    reps = max(3, int(READ_SECONDS * 20e9 / max(n_bytes, 1)))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t) / reps)
    return best


def read_speeds(loops, sizes, rounds):
    """{(dtype, size): {loop name or "torch": GB/s}}: the median over rounds, the loops in turn in each."""
    got = {}
    for dname, (dtype, kind) in DTYPES.items():
        for n in sizes:
            x = torch.randn(n).to(dtype)
            address, nbytes = x.data_ptr(), n * x.element_size()
            kernel = moments.kernel

            def torch_reads():
                x.aminmax()
                x.sum(dtype=torch.float32 if dtype is torch.bfloat16 else None)
                torch.linalg.vector_norm(x)

            times = {name: [] for name in [moments.LOOPS[lv] for lv in loops] + ["torch"]}
            for _ in range(rounds):
                for lv in loops:
                    with moments.using_loop(lv):
                        times[moments.LOOPS[lv]].append(_read_seconds(lambda: kernel(address, n, kind, 1), nbytes))
                times["torch"].append(_read_seconds(torch_reads, nbytes))
            got[(dname, n)] = {name: nbytes / statistics.median(ts) / 1e9 for name, ts in times.items()}
    return got


def step_costs(models, loops, rounds, steps, log):
    """{(model, level): {loop name: extra ms a dumped step}}: median over rounds of (median dumped step with
    that loop - median plain step)."""
    got = {}
    root = tempfile.mkdtemp(prefix="msprobe_stats_kernel_")
    try:
        with harness.young_heap():
            for model in models:
                work = Workload(model)
                for level in LEVELS:
                    extra = {moments.LOOPS[lv]: [] for lv in loops}
                    for r in range(rounds):
                        folder = os.path.join(root, f"{model}-{level}-{r}")
                        dbg = PrecisionDebugger(task="statistics", level=level, dump_path=folder)

                        def dumped():
                            dbg.start(work.model)
                            work.train_step()
                            dbg.stop()
                            dbg.step()

                        try:
                            dumped()  # (hooks installed, API table built: not timed)
                            times = {lv: [] for lv in loops}
                            plain = []
                            for _ in range(steps):
                                for lv in harness.rotated(loops, r):
                                    with moments.using_loop(lv):
                                        times[lv].append(harness.timed_steps(dumped, 1)[0][harness.WALL])
                                plain.append(harness.timed_steps(work.train_step, 1)[0][harness.WALL])
                        finally:
                            dbg.close()
                            shutil.rmtree(folder, ignore_errors=True)
                        base = statistics.median(plain)
                        for lv in loops:
                            extra[moments.LOOPS[lv]].append((statistics.median(times[lv]) - base) * 1e3)
                    got[(model, level)] = {name: statistics.median(v) for name, v in extra.items()}
                    log(f"{model} {level}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in got[(model, level)].items()))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return got


def render(speeds, costs, loops):
    names = [moments.LOOPS[lv] for lv in loops]
    widest = names[-1]
    lines = [f"statistics kernel read speed, GB/s (one thread; median of rounds); torch: aminmax + sum + norm; "
             f"this CPU's widest loop: {moments.LOOPS[moments.VECTORS]}",
             f"{'dtype':<9} {'elements':>9} " + " ".join(f"{n:>9}" for n in names + ["torch"])
             + f"  {widest + ' / ' + names[-2] if len(names) > 1 else '':>16}",
             "-" * (21 + 10 * (len(names) + 1) + 18)]
    for (dname, n), row in speeds.items():
        ratio = f"{row[widest] / row[names[-2]]:.2f}x" if len(names) > 1 else ""
        lines.append(f"{dname:<9} {n:>9} " + " ".join(f"{row[k]:>9.1f}" for k in names + ["torch"]) + f"  {ratio:>16}")
    if costs:
        lines += ["", "a dumped step's extra ms with each loop (statistics task; median of rounds), and each loop's "
                  f"extra over {widest}'s",
                  f"{'model':<12} {'level':<6} " + " ".join(f"{n:>9}" for n in names) + " "
                  + " ".join(f"{n + '/' + widest:>18}" for n in names[:-1]),
                  "-" * (20 + 10 * len(names) + 19 * (len(names) - 1))]
        for (model, level), row in costs.items():
            lines.append(f"{model:<12} {level:<6} " + " ".join(f"{row[n]:>9.2f}" for n in names) + " "
                         + " ".join(f"{row[n] / row[widest]:>17.2f}x" for n in names[:-1]))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_options(p, rounds=5, steps=3, quick=(1, 1), threads=1)
    p.add_argument("--models", type=lambda v: harness.parse_list(v, CPU_MODELS + UNTUNED_MODELS, "model"),
                   default=list(CPU_MODELS), help=f"comma list of {','.join(CPU_MODELS + UNTUNED_MODELS)} (default: "
                   f"{','.join(CPU_MODELS)}; {','.join(UNTUNED_MODELS)}: the untuned half, with transformers installed)")
    p.add_argument("--no-steps", action="store_true", help="the read speeds only")
    args = p.parse_args(argv)
    harness.check_common_options(p, args)
    if moments.kernel is None:
        p.error(f"the statistics kernel is not in use here: {moments.describe()}")
    hf = [m for m in args.models if m in UNTUNED_MODELS]
    if hf and not args.no_steps and importlib.util.find_spec("transformers") is None:
        p.error(f"--models: {', '.join(hf)} need transformers; install it (pip install -e '.[test]')")
    torch.set_num_threads(args.threads)
    loops = list(range(moments.VECTORS + 1))
    if not args.quick and len(loops) > 1:
        loops = loops[1:]  # the portable loop is 5-10x slower: it would only stretch the step table
    log = harness.logger(args.quiet)
    sizes = SIZES[:2] if args.quick else SIZES
    speeds = read_speeds(loops, sizes, args.rounds)
    costs = {} if args.no_steps else step_costs(args.models, loops, args.rounds, args.steps, log)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} torch thread(s); {moments.describe()}")
    print(render(speeds, costs, loops))
    harness.write_json(args.json, {"speeds": {f"{d} {n}": v for (d, n), v in speeds.items()},
                                   "steps": {f"{m} {lv}": v for (m, lv), v in costs.items()}})
    return 0


def section(argv):
    """The RESULTS.md section a run with `argv` records into: a run of the untuned models keeps its own (None:
    the script's)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--models", default="")
    models = [m for m in p.parse_known_args(argv)[0].models.split(",") if m]
    if models and all(m in UNTUNED_MODELS for m in models):
        return "stats_kernel.py --models " + ",".join(m for m in UNTUNED_MODELS if m in models)
    return None


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("stats_kernel.py", main, section(sys.argv[1:])))

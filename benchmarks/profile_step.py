"""Where a dumped step's host time goes: cProfile of a few steps of a dump_overhead.py workload.

    python benchmarks/profile_step.py --device cuda --config stat_L1 --steps 3 [--out profile.txt]
"""

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import tempfile

from dump_overhead import CONFIG_SPECS, Runner
from models import Workload


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--model", default=None, help="a dump_overhead.py model (default: gpt on cuda, transformer on cpu)")
    p.add_argument("--config", default="stat_L1", choices=[c for c, s in CONFIG_SPECS.items() if s])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--gpt-blocks", type=int, default=8)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", help="also write the table here")
    p.add_argument("--plain", action="store_true",
                   help="run the steps without cProfile, for a sampling profiler outside that sees every thread "
                        "(py-spy record --threads -- python benchmarks/profile_step.py --plain ...): on CUDA the "
                        "backward hooks run on autograd's device thread, which cProfile does not see")
    args = p.parse_args(argv)
    model = args.model or ("gpt" if args.device == "cuda" else "transformer")
    work = Workload(model, args.device, args.gpt_blocks)
    root = tempfile.mkdtemp(prefix="msprobe_profile_")
    try:
        runner = Runner(args.config, work, root)
        for _ in range(2):  # warm-up: API table, kernels compiled
            runner.step()
        prof = None if args.plain else cProfile.Profile()
        if prof is not None:
            prof.enable()
        for _ in range(args.steps):
            runner.step()
        if prof is not None:
            prof.disable()
        runner.rest()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if prof is None:
        return 0
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(args.top)
    print(text.getvalue())
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())

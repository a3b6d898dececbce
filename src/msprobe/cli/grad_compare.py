"""Compare the gradients of two runs recorded by grad_probe: the first step where they diverge.

  msprobe grad_compare RUN_A RUN_B -o ./grad_cmp
  msprobe grad_compare -i RUN_A RUN_B -o ./grad_cmp

Per step and parameter, the share of gradient elements whose sign agrees; runs diverge at the first
step whose element-weighted total is below --threshold or fell by more than --drop. Writes
rank{R}/similarities.csv, PNG plots per parameter and overall, and grad_compare.json.
"""

import os

from msprobe.cli import options
from msprobe.core.errors import MsprobeError


def add_arguments(parser):
    parser.add_argument("dirs", nargs="*", metavar="RUN", help="the two grad_probe dump_paths (or rank dirs)")
    options.add_input(parser, "the same, as an option", nargs=2, metavar=("RUN_A", "RUN_B"), required=False)
    options.add_output(parser, "output directory")
    parser.add_argument("--threshold", type=float, default=None, help="total similarity below this diverges (0.97)")
    parser.add_argument("--drop", type=float, default=None,
                        help="a fall larger than this between steps diverges (0.03)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    options.add_progress(parser)


def run(args):
    from msprobe.core.grad_probe.compare import DROP, THRESHOLD, compare_grad_runs
    from msprobe.core.grad_probe.report import format_comparison, write_comparison

    dirs = list(args.input_path or []) + list(args.dirs)
    if len(dirs) != 2:
        raise MsprobeError(f"expected two runs (RUN_A RUN_B or -i RUN_A RUN_B), got {len(dirs)}: {dirs}")
    threshold = THRESHOLD if args.threshold is None else args.threshold
    drop = DROP if args.drop is None else args.drop
    cmps = compare_grad_runs(dirs[0], dirs[1], threshold, drop)
    print(format_comparison(cmps))
    written = write_comparison(cmps, args.output_path, threshold, drop, plots=not args.no_plots,
                               progress=not args.no_progress)
    print("Result written to:")
    for path, count in written:
        print(f"  {os.path.abspath(path)}" + (f"{os.sep} ({count} PNG plots)" if os.path.isdir(path) else ""))
    return 0

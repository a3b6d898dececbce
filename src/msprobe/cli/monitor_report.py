"""Charts and an HTML page of per-module trends from a training-state monitor output, anomalies marked.

  msprobe monitor_report -i ./monitor_output -o ./monitor_report
"""

import os

from msprobe.cli import options


def add_arguments(parser):
    options.add_input(parser, "monitor output dir (holding *-rank{r}-* dirs) or one rank dir; CSV or TensorBoard")
    options.add_output(parser, "report dir")
    parser.add_argument("--ops", help="comma list of ops to chart (default: all in the data)")


def run(args):
    from msprobe.core.monitor.ops import chosen_ops
    from msprobe.core.monitor.report import build_report

    ops = None
    if args.ops:
        ops = chosen_ops([o.strip() for o in args.ops.split(",") if o.strip()], "--ops", args.ops)
    result = build_report(args.input_path, args.output_path, ops=ops)
    print(f"monitor_report: {result.rows} rows, {result.anomalies} anomalies; wrote "
          f"{os.path.abspath(result.html_path)} and {len(result.png_paths)} charts:")
    for path in result.png_paths:
        print(f"  {os.path.abspath(path)}")
    return 0

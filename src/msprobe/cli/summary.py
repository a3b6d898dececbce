"""Summarise a dump: per step and rank, what was recorded and where values look suspicious.

  msprobe summary -i ./dump_path
"""

from msprobe.core.dump.summary import format_summary, summarize_dump


def add_arguments(parser):
    parser.add_argument("-i", "--input", required=True, help="dump root, step dir, rank dir or dump.json")
    parser.add_argument("--top", type=int, default=5, help="how many largest-norm records to list (default 5)")


def run(args):
    print(format_summary(summarize_dump(args.input), top=args.top))
    return 0

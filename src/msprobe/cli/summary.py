"""Summarise a dump: per step and rank, what was recorded and where values look suspicious.

  msprobe summary -i ./dump_path

Exit code: 0, 1 on bad input, also when a step or rank could not be read (named on stderr; the others are
summarised).
"""

import sys

from msprobe.cli import options

from msprobe.core.dump.summary import format_summary, summarize_dump
from msprobe.core.errors import EXIT_PARTIAL


def add_arguments(parser):
    options.add_input(parser, "dump root, step dir, rank dir or dump.json")
    parser.add_argument("--top", type=int, default=5, help="how many largest-norm records to list (default 5)")


def run(args):
    skipped = []
    summaries = summarize_dump(args.input_path, skipped=skipped)
    print(format_summary(summaries, top=args.top))
    for line in skipped:
        print(line, file=sys.stderr)
    return EXIT_PARTIAL if skipped else 0

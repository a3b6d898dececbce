"""Find the first node whose inputs are finite but whose output is inf/nan, across steps and ranks.

  msprobe overflow_check -i ./dump_path [-o ./output]

Reads statistics or tensor dumps (ours or msProbe's, rank{N} or proc{pid} directories). A collective
whose inf/nan came from another rank is traced to the op on that rank that produced it. Prints the
culprit with its call stack and writes anomaly_analyze_{timestamp}.json into the output directory.
Exit code: 0, 1 on bad input, also when a step or rank could not be read (named on stderr; the others are
checked).
"""

import os
import sys

from msprobe.cli import options
from msprobe.core.errors import EXIT_PARTIAL


def add_arguments(parser):
    options.add_input(parser, "dump root, step dir, rank dir or dump.json")
    options.add_output(parser, "directory for anomaly_analyze_{timestamp}.json")
    options.add_progress(parser)


def run(args):
    from msprobe.core.overflow import analyze_overflow
    from msprobe.core.overflow.report import format_analysis, write_analysis_json

    analysis = analyze_overflow(args.input_path, progress=not args.no_progress)
    print(format_analysis(analysis))
    path = write_analysis_json(analysis, args.output_path)
    print(f"Result written to {os.path.abspath(path)}")
    for line in analysis.skipped:
        print(line, file=sys.stderr)
    return EXIT_PARTIAL if analysis.skipped else 0

"""Model hierarchy graph coloured by precision, as one HTML page that opens from disk.

  msprobe graph_visualize -tp TARGET_DUMP [-gp GOLDEN_DUMP] [-o OUT] [-lm layer_mapping.yaml] [-fm] [-oc]
  msprobe graph -i compare.json [-o OUT]

TARGET/GOLDEN: a rank dir (step0/rank0), a step dir (all ranks) or a dump root (all steps), dumped at
level L0 or mix. Without a golden dump one graph is built; with it, each step/rank is compared and
nodes are coloured pass / warning / error / unmatched. compare.json holds "npu_path", optional
"bench_path", "stack_path" and "is_print_compare_log" (compare's "engine"/"address": accepted, unused).
Writes build_{ts}.html or compare_{ts}.html and the same graph as SQLite, {name}.vis.db (tables graphs,
nodes, tensors, stacks).
Exit code: 0, 1 on bad input, also when a step or rank could not be read (named on stderr; the others are
drawn).
"""

import logging
import os
import sys

from msprobe.cli import options
from msprobe.core.errors import EXIT_PARTIAL

def _command(parser):
    return parser.prog.split()[-1]  # this module serves both `graph_visualize` and `graph`


def add_arguments(parser):
    if _command(parser) == "graph":
        options.add_input(parser, "compare.json (npu_path, bench_path, ...)")
    else:
        parser.add_argument("-tp", "--target_path", required=True, help="target dump: rank dir, step dir or root")
        parser.add_argument("-gp", "--golden_path", help="golden dump to compare with (omit to build one graph)")
        parser.add_argument("-lm", "--layer_mapping", help="layer mapping YAML for renamed or cross-framework layers")
        parser.add_argument("-fm", "--fuzzy_match", action="store_true", help="match APIs ignoring call indexes")
        parser.add_argument("-oc", "--overflow_check", action="store_true", help="mark nodes with inf/nan")
    options.add_output(parser, "output folder")
    options.add_runs(parser)
    options.add_progress(parser)


def run(args):
    from msprobe.core.graph.build import visualize

    if args.command == "graph":
        from msprobe.core.compare.compare_json import read_compare_json
        cfg = read_compare_json(args.input_path, golden_required=False)
        if cfg.is_print_compare_log:
            logging.getLogger("msprobe").setLevel(logging.INFO)
        out = visualize(cfg.npu_path, args.output_path, golden_path=cfg.bench_path,
                        stack_path=cfg.stack_path, progress=not args.no_progress,
                        target_run=args.target_run, golden_run=args.golden_run)
    else:
        out = visualize(args.target_path, args.output_path, golden_path=args.golden_path,
                        layer_mapping=args.layer_mapping, fuzzy_match=args.fuzzy_match,
                        overflow_check=args.overflow_check, progress=not args.no_progress,
                        target_run=args.target_run, golden_run=args.golden_run)
    for note in out.pairing:
        print(note)
    nodes = sum(len(g["names"]) for g in out.document["graphs"])
    print(f"{len(out.document['graphs'])} graph(s), {nodes} nodes")
    print(f"page: {os.path.abspath(out.html_path)}")
    print(f"data: {os.path.abspath(out.db_path)}")
    for line in out.skipped:
        print(line, file=sys.stderr)
    return EXIT_PARTIAL if out.skipped else 0


"""Model hierarchy graph coloured by precision, as one HTML page that opens from disk.

  msprobe graph_visualize -tp TARGET_DUMP [-gp GOLDEN_DUMP] -o OUT [-lm layer_mapping.yaml] [-fm] [-oc]
  msprobe graph -i compare.json -o OUT

TARGET/GOLDEN: a rank dir (step0/rank0), a step dir (all ranks) or a dump root (all steps), dumped at
level L0 or mix. Without a golden dump one graph is built; with it, each step/rank is compared and
nodes are coloured pass / warning / error / unmatched. compare.json holds "npu_path", "bench_path",
optional "stack_path" and "is_print_compare_log". Writes build_{ts}.html or compare_{ts}.html and the
same graph as SQLite, {name}.vis.db (tables graphs, nodes, tensors, stacks).
Exit code: 0, 1 on bad input, 3 when a step or rank could not be read (named on stderr; the others are
drawn).
"""

import logging
import os
import sys

from msprobe.cli import options
from msprobe.core.errors import EXIT_PARTIAL, ConfigError, MsprobeError

_COMPARE_JSON_FIELDS = ("npu_path", "bench_path", "stack_path", "is_print_compare_log")


def _command(parser):
    return parser.prog.split()[-1]  # this module serves both `graph_visualize` and `graph`


def add_arguments(parser):
    if _command(parser) == "graph":
        parser.add_argument("-i", "--input_path", required=True, help="compare.json (npu_path, bench_path, ...)")
    else:
        parser.add_argument("-tp", "--target_path", required=True, help="target dump: rank dir, step dir or root")
        parser.add_argument("-gp", "--golden_path", help="golden dump to compare with (omit to build one graph)")
        parser.add_argument("-lm", "--layer_mapping", help="layer mapping YAML for renamed or cross-framework layers")
        parser.add_argument("-fm", "--fuzzy_match", action="store_true", help="match APIs ignoring call indexes")
        parser.add_argument("-oc", "--overflow_check", action="store_true", help="mark nodes with inf/nan")
    parser.add_argument("-o", "--output_path", required=True, help="output folder")
    options.add_runs(parser)
    options.add_progress(parser)


def run(args):
    from msprobe.core.graph.build import visualize

    if args.command == "graph":
        cfg = read_compare_json(args.input_path)
        if cfg.get("is_print_compare_log"):
            logging.getLogger("msprobe").setLevel(logging.INFO)
        out = visualize(cfg["npu_path"], args.output_path, golden_path=cfg.get("bench_path"),
                        stack_path=cfg.get("stack_path"), progress=not args.no_progress,
                        target_run=args.target_run, golden_run=args.golden_run)
    else:
        for flag, value in (("-tp", args.target_path), ("-gp", args.golden_path), ("-lm", args.layer_mapping)):
            if value is not None and not os.path.exists(value):
                raise MsprobeError(f"{flag} '{value}': no such file or directory")
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


def read_compare_json(path):
    """compare.json as a dict, with every field checked."""
    from msprobe.core.dump.reader import load_json

    cfg = load_json(path)
    if not isinstance(cfg, dict):
        raise ConfigError("compare.json", type(cfg).__name__, "an object with " + ", ".join(_COMPARE_JSON_FIELDS))
    for key in cfg:
        if key not in _COMPARE_JSON_FIELDS:
            raise ConfigError(key, cfg[key], "fields " + " | ".join(_COMPARE_JSON_FIELDS))
    if not isinstance(cfg.get("npu_path"), str):
        raise ConfigError("npu_path", cfg.get("npu_path"), "path of the target dump.json or rank directory")
    for key in ("npu_path", "bench_path", "stack_path"):
        value = cfg.get(key)
        if value is None and key != "npu_path":
            continue
        if not isinstance(value, str) or not os.path.exists(value):
            raise ConfigError(key, value, "an existing file or directory")
    if not isinstance(cfg.get("is_print_compare_log", False), bool):
        raise ConfigError("is_print_compare_log", cfg["is_print_compare_log"], "true | false")
    return cfg

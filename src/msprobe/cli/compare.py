"""Compare a target dump with a golden dump, tensor by tensor; then diagnose where error enters.

  msprobe compare -tp ./bf16_dump -gp ./fp32_dump -o ./output
  msprobe compare -i compare.json -o ./output [-lm layer_mapping.yaml]
  msprobe -f mindspore compare -i compare.json -o ./output -am

Inputs: two dump.json files, two rank dirs, two step dirs (ranks pair by number) or two dump roots
(one result file per step and rank). The mode follows the dumps' task: tensor (cosine, errors),
statistics (Max/Min/Mean/Norm differences) or md5 (checksum equality). compare.json holds
npu_path (target), bench_path (golden), stack_path, is_print_compare_log, and engine/address.
The rank pairs run on worker processes of this host, or with --engine ray as Ray tasks on a cluster
(--address, RAY_ADDRESS, or a local Ray), each pair's rows also written as a Parquet part under rows/.
The diagnosis names where error is introduced beyond what the target's precision explains (printed
whole, or in one line with --brief) and labels every row in the Diagnosis column.
Exit code: 0, 1 on bad input or when some steps or ranks could not be compared (each named in one line
on stderr; the others are compared), 2 with --fail-on-divergence when the diagnosis finds a divergence or the
two dumps mostly do not match.
"""

import argparse
import sys

from msprobe.cli import options
from msprobe.core.errors import EXIT_PARTIAL, MsprobeError


def add_arguments(parser):
    src = parser.add_argument_group("inputs")
    options.add_input(src, "compare.json with npu_path, bench_path, stack_path, is_print_compare_log, engine, "
                           "address", required=False)
    src.add_argument("-tp", "--target_path", help="target dump: dump.json, rank dir, step dir or dump root")
    src.add_argument("-gp", "--golden_path", help="golden (benchmark) dump, same kind as -tp")
    options.add_runs(parser)
    out = parser.add_argument_group("output")
    options.add_output(out, "result folder")
    out.add_argument("--xlsx", action="store_true", help="write xlsx with error/warning and diagnosis cells "
                                                         "highlighted instead of csv")
    out.add_argument("-s", "--stack_mode", action="store_true", help=argparse.SUPPRESS)  # stacks are automatic
    out.add_argument("-tensor_log", "--is_print_compare_log", action="store_true",
                     help="print one line per call that is not a pass")
    options.add_progress(out)
    match = parser.add_argument_group("matching")
    match.add_argument("-fm", "--fuzzy_match", action="store_true", help="pair calls ignoring call indices")
    match.add_argument("-dm", "--data_mapping", metavar="YAML", help="tensor names target: golden (one rank)")
    match.add_argument("-cm", "--cell_mapping", nargs="?", const=True, metavar="YAML",
                       help="module/cell path.Class pairs target: golden")
    match.add_argument("-am", "--api_mapping", nargs="?", const=True, metavar="YAML",
                       help="MindSpore -> PyTorch API mapping: built-in table, plus this file's entries")
    match.add_argument("-lm", "--layer_mapping", nargs="?", const=True, metavar="YAML",
                       help="layer child names {LayerClass: {target: golden}} for cross-framework L0/mix")
    match.add_argument("-m", "--mode", default="auto", choices=("auto",), help="only auto (the default)")
    match.add_argument("--workers", type=int, default=None,
                       help="worker processes for the rank pairs of a big compare and for the tensors in "
                            "tensor mode (default: CPUs)")
    scale = parser.add_argument_group("engine")
    scale.add_argument("--engine", choices=("pool", "ray"), default=None,
                       help="where the rank pairs run: pool (worker processes of this host, the default) or "
                            "ray (one Ray task per pair; pip install \"msprobe[ray]\")")
    scale.add_argument("--address", metavar="ADDR", help="the Ray cluster to attach to (host:port of "
                       "`ray start --head`); default RAY_ADDRESS, else a local Ray started for this compare")
    scale.add_argument("--resume", action="store_true",
                       help="continue an interrupted compare into the same -o: the pairs whose Parquet parts "
                            "(rows/) are complete are not compared again")
    options.add_diagnosis(parser)


def _inputs(args):
    """(target, golden, stack_path, print_log, engine, address); the command line wins over compare.json."""
    stack_path, print_log = None, args.is_print_compare_log
    if args.input_path:
        if args.target_path or args.golden_path:
            raise MsprobeError("give either -i compare.json or -tp/-gp, not both")
        from msprobe.core.compare.compare_json import read_compare_json
        cfg = read_compare_json(args.input_path)
        engine, address = args.engine or cfg.engine, args.address or cfg.address
        return (cfg.npu_path, cfg.bench_path, cfg.stack_path, print_log or cfg.is_print_compare_log,
                engine or "pool", address)
    if not (args.target_path and args.golden_path):
        raise MsprobeError("give -tp TARGET and -gp GOLDEN (or -i compare.json)")
    return args.target_path, args.golden_path, stack_path, print_log, args.engine or "pool", args.address


def _optional_yaml(value):
    """-cm/-lm without a file mean 'same names' (nothing to map); -am without a file is the table."""
    return None if value is True else value


def _print_log(result):
    import numpy as np
    verdicts, names = result.rows.verdicts, result.rows.target["name"].to_numpy(dtype=object)
    for i in np.flatnonzero(np.isin(verdicts.result, ("error", "warning"))):
        print(f"  [{verdicts.result[i]}] {names[i]}: {', '.join(verdicts.messages(i))}")


def _where(result):
    if result.step is None:
        return ""
    return f"step {result.step} {'process' if result.is_proc else 'rank'} {result.rank}: "


def run(args):
    from msprobe.core.compare.outputs import write_compare
    from msprobe.core.compare.rank_pairs import result_counts
    from msprobe.core.diagnosis import format_diagnosis

    target, golden, stack_path, print_log, engine, address = _inputs(args)
    out = write_compare(
        target, golden, args.output_path, xlsx=args.xlsx, precision=args.precision,
        fuzzy_match=args.fuzzy_match, data_mapping=args.data_mapping,
        cell_mapping=_optional_yaml(args.cell_mapping), api_mapping=args.api_mapping,
        layer_mapping=_optional_yaml(args.layer_mapping), stack=True, stack_path=stack_path,
        progress=not args.no_progress, workers=args.workers, target_run=args.target_run,
        golden_run=args.golden_run, keep_tables=print_log, engine=engine, address=address, resume=args.resume)
    for note in out.pairing:
        print(note)
    if out.mostly_unmatched:  # before anything else: nothing below means much then
        print(f"warning: {out.diagnosis.unmatched}")
    for r in out.results:
        counts = result_counts(r)
        summary = ", ".join(f"{n} {k}" for k, n in counts.items())
        print(f"{_where(r)}{r.mode} compare, {r.row_count} rows ({summary}) -> {r.output_path}")
        if print_log:
            _print_log(r)
    print(format_diagnosis(out.diagnosis, brief=args.brief))
    print(f"diagnosis -> {out.diagnosis_path}")
    for line in out.failed_pairs:
        print(line, file=sys.stderr)
    if args.fail_on_divergence and out.failed:
        return 2
    return EXIT_PARTIAL if out.failed_pairs else 0

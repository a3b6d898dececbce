"""Offline API pre-check: re-run every API of an L1 dump on this machine's device (CPU, or CUDA/NPU
when present) in its dumped dtypes, against a float64 CPU benchmark; pass iff cosine > 0.99 and
max abs error < 1e-4, plus a dtype-aware (ULP) verdict in trailing columns.

  msprobe acc_check -api_info ./dump.json [-o OUT] [-csv_path RESULT_CSV] [-save_error_data]
  msprobe multi_acc_check -api_info ./dump.json -d 0 1 [-o OUT] [-csv_path RESULT_CSV]

A statistics dump gives random inputs in each tensor's recorded range, a tensor dump the real inputs.
`run_ut` / `multi_run_ut` are the same commands. The framework is read from the dump.
"""

import logging
import os
import sys

from msprobe.cli import options

MULTI_COMMANDS = ("multi_acc_check", "multi_run_ut")

logger = logging.getLogger(__name__)


def add_arguments(parser):
    parser.add_argument("-api_info", "--api_info_file", dest="api_info", required=True,
                        help="dump.json of one rank (level L1 or mix)")
    options.add_output(parser, "directory for the result CSVs", "--out_path", default=options.ACC_CHECK_OUTPUT)
    parser.add_argument("-csv_path", "--result_csv_path", dest="result_csv_path", default=None,
                        help="accuracy_checking_result_{timestamp}.csv of an interrupted run: resume it")
    parser.add_argument("-save_error_data", "--save_error_data", dest="save_error_data", action="store_true",
                        help="save inputs/outputs and a reproduce.py of failing APIs under OUT/error_data/")
    parser.add_argument("-d", "--device", dest="device", type=int, nargs="+", default=None,
                        help="device id(s) under test; multi_acc_check starts one worker per id "
                             "(on a CPU machine: that many CPU workers). Default 0")
    options.add_framework(parser, dest="framework_arg")
    parser.add_argument("--custom_api", action="append", default=[], metavar="PREFIX=MODULE",
                        help="where APIs recorded as PREFIX.name (register_custom_api) are defined, "
                             "e.g. MyOps=mypkg.ops; repeatable")
    parser.add_argument("--seed", type=int, default=1234, help="seed of the random inputs (default 1234)")
    parser.add_argument("--max-elements", "--max_elements", dest="max_elements", type=int, default=None,
                        metavar="N", help="an API whose recorded tensors hold more than N elements in all is "
                                          "skipped, not built (default 300,000,000)")
    options.add_progress(parser)


def run(args):
    import time

    started = time.perf_counter()  # what the user waits for: imports and reading the dump included
    from msprobe.core.acc_check.runner import run_acc_check, run_multi_acc_check
    from msprobe.core.acc_check.summary import format_summary
    from msprobe.core.errors import MsprobeError

    if not os.path.isfile(args.api_info):
        raise MsprobeError(f"-api_info '{args.api_info}': no such file; expected a dump.json")
    framework = args.framework_arg or getattr(args, "framework", None)
    multi = args.command in MULTI_COMMANDS
    devices = args.device or [0]
    if not multi and len(devices) > 1:
        raise MsprobeError(f"-d {' '.join(map(str, devices))}: acc_check runs on one device; "
                           "use multi_acc_check for several")
    common = dict(out_path=args.output_path, resume_csv=args.result_csv_path, save_error_data=args.save_error_data,
                  custom_apis=tuple(args.custom_api), progress=not args.no_progress and sys.stderr.isatty(),
                  seed=args.seed, max_elements=args.max_elements)
    if multi:
        report = run_multi_acc_check(args.api_info, devices=devices, **common)
    else:
        report = run_acc_check(args.api_info, device=args.device[0] if args.device else None, **common)
    if framework and framework != report.framework and report.framework != "mindtorch":
        logger.warning("-f %s ignored: the dump is a %s dump", framework, report.framework)
    report.seconds = time.perf_counter() - started
    print(format_summary(report))
    return 0


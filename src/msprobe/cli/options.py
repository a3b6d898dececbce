"""Options several subcommands share, defined once as titled argparse groups: each command spells and
explains them alike. Old spellings stay accepted as aliases (`--no_progress` of `--no-progress`).
"""

PRECISIONS = ("bfloat16", "float16", "tf32", "float8_e4m3fn", "float8_e5m2", "float32")
FRAMEWORKS = ("pytorch", "mindspore")
# msProbe's compare default (a folder `output` in the working directory), for every command that writes
# but acc_check, whose msProbe default (the working directory) its quick start relies on
DEFAULT_OUTPUT = "./output"
ACC_CHECK_OUTPUT = "./"


def add_input(parser, help, **kw):
    """`-i`/`--input_path`/`--input` (dest `input_path`): what the command reads; required unless told."""
    kw.setdefault("required", True)
    parser.add_argument("-i", "--input_path", "--input", dest="input_path", help=help, **kw)


def add_output(parser, what, *aliases, default=DEFAULT_OUTPUT):
    """`-o`/`--output_path`/`--output` (dest `output_path`): where results are written."""
    parser.add_argument("-o", "--output_path", "--output", *aliases, dest="output_path", default=default,
                        help=f"{what} (default {default})")


def add_framework(parser, dest="framework"):
    """`-f`/`--framework`: accepted for msProbe compatibility; every command reads the framework from the dump."""
    parser.add_argument("-f", "--framework", dest=dest, choices=FRAMEWORKS,
                        help="accepted for compatibility; the framework is read from the dump")


def add_progress(parser):
    """`--no-progress` (old spelling `--no_progress`): no progress bar."""
    parser.add_argument("--no-progress", "--no_progress", dest="no_progress", action="store_true",
                        help="no progress bar")


def add_runs(parser):
    """`--target-run`/`--golden-run`: which of several proc{pid} runs of a step to compare."""
    group = parser.add_argument_group("runs (dumps made without a process group: one proc{pid} dir per run)")
    group.add_argument("--target-run", "--target_run", dest="target_run", metavar="NAME",
                       help="the target run to compare where a step holds several (proc4242, or 'all' to pair "
                            "them all in time order); default: the newest")
    group.add_argument("--golden-run", "--golden_run", dest="golden_run", metavar="NAME",
                       help="the same for the golden dump")


def add_diagnosis(parser):
    """How the diagnosis judges and reports: `--precision`, `--brief`, `--fail-on-divergence`."""
    group = parser.add_argument_group("diagnosis")
    group.add_argument("--precision", choices=PRECISIONS, metavar="DTYPE",
                       help="the precision the target may round to everywhere: " + ", ".join(PRECISIONS) +
                            " (tf32: accelerators whose float32 matmuls round to it); default: inferred from "
                            "the dtypes the target holds where golden holds finer ones (autocast)")
    group.add_argument("--brief", action="store_true", help="print the diagnosis in one line")
    group.add_argument("--fail-on-divergence", "--fail_on_divergence", dest="fail_on_divergence",
                       action="store_true",
                       help="exit 2 when the diagnosis finds a divergence or the dumps mostly do not match")
    group.add_argument("-da", "--diff_analyze", action="store_true",
                       help="accepted for msProbe compatibility: the full diagnosis is always printed")

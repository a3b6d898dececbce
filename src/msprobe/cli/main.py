"""The `msprobe` command: dispatch to one module per subcommand, importing only the chosen one.

Each subcommand module has a docstring (its help), `add_arguments(parser)` and `run(args) -> int`.
`msprobe -h` works without torch or mindspore installed.
"""

import argparse
import importlib
import logging
import sys

import msprobe
from msprobe.core.errors import MsprobeError

# (command, module): order is the order of `msprobe -h`.
COMMANDS = (
    ("summary", "msprobe.cli.summary"),
    ("compare", "msprobe.cli.compare"),
    ("overflow_check", "msprobe.cli.overflow_check"),
    ("grad_compare", "msprobe.cli.grad_compare"),
    ("monitor_report", "msprobe.cli.monitor_report"),
    ("graph_visualize", "msprobe.cli.graph"),
    ("graph", "msprobe.cli.graph"),
    ("acc_check", "msprobe.cli.acc_check"),
    ("multi_acc_check", "msprobe.cli.acc_check"),
    ("run_ut", "msprobe.cli.acc_check"),
    ("multi_run_ut", "msprobe.cli.acc_check"),
)


def _load(module_path):
    try:
        return importlib.import_module(module_path), None
    except ImportError as e:  # the command stays listed; its help says why it cannot run
        return None, e


def build_parser():
    parser = argparse.ArgumentParser(prog="msprobe", description="Precision debugging for PyTorch and MindSpore.")
    parser.add_argument("--version", action="version", version=f"msprobe {msprobe.__version__}")
    parser.add_argument("-f", "--framework", choices=("pytorch", "mindspore"),
                        help="accepted for compatibility; the framework is read from the dump")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, path in COMMANDS:
        module, error = _load(path)
        doc = (module.__doc__ or "").strip() if module else f"unavailable: {error}"
        p = sub.add_parser(name, help=doc.splitlines()[0] if doc else name, description=doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if module is not None:
            module.add_arguments(p)
        p.set_defaults(_module=module, _error=error)
    return parser


def main(argv=None):
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 0
    if args._module is None:
        print(f"msprobe {args.command}: unavailable: {args._error}", file=sys.stderr)
        return 1
    try:
        return args._module.run(args) or 0
    except MsprobeError as e:
        print(f"msprobe {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

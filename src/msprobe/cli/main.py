"""The `msprobe` command: dispatch to one module per subcommand, importing only the chosen one.

Each subcommand module has a docstring (its help), `add_arguments(parser)` and `run(args) -> int`.
`msprobe -h` reads the docstrings from source and imports no subcommand module; it works without torch
or mindspore installed.
"""

import argparse
import ast
import importlib
import importlib.util
import logging
import os
import sys

import msprobe
from msprobe.cli import options
from msprobe.core.errors import MsprobeError

# (command, module, aliases): order is the order of `msprobe -h`.
COMMANDS = (
    ("summary", "msprobe.cli.summary", ()),
    ("compare", "msprobe.cli.compare", ()),
    ("overflow_check", "msprobe.cli.overflow_check", ()),
    ("grad_compare", "msprobe.cli.grad_compare", ()),
    ("monitor_report", "msprobe.cli.monitor_report", ()),
    ("graph_visualize", "msprobe.cli.graph", ()),
    ("graph", "msprobe.cli.graph", ()),
    ("acc_check", "msprobe.cli.acc_check", ("run_ut",)),
    ("multi_acc_check", "msprobe.cli.acc_check", ("multi_run_ut",)),
)
# one-line help where a module serves several commands that differ
HELP = {"graph": "The graph of graph_visualize, from a compare.json (npu_path, bench_path, ...).",
        "multi_acc_check": "acc_check on several devices (or CPU workers) at once: -d 0 1 ..."}


def _summary(doc):
    """The first sentence of a module docstring, for `msprobe -h`."""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    return paragraph.split(". ")[0].rstrip(".") + "."


def _docstring(module_path):
    """A subcommand module's docstring, read from its source without importing it."""
    with open(importlib.util.find_spec(module_path).origin, encoding="utf-8") as f:
        return ast.get_docstring(ast.parse(f.read())) or ""


def _chosen(argv):
    """The subcommand named on the command line (its first name, aliases resolved), or None."""
    names = {n: name for name, _, aliases in COMMANDS for n in (name, *aliases)}
    return next((names[a] for a in argv if a in names), None)


def _load(module_path):
    try:
        return importlib.import_module(module_path), None
    except ImportError as e:  # the command stays listed; its help says why it cannot run
        return None, e


def _unprefixed(message):
    """A message without a leading command name: the line already starts with `msprobe {command}:`."""
    for name, _, aliases in COMMANDS:
        for n in (name, *aliases):
            if message.startswith(n + ": "):
                return message[len(n) + 2:]
    return message


def build_parser(command=all):
    """The `msprobe` parser; `command` (a first name from COMMANDS, or None) limits the subcommands whose
    module is imported for their options to that one, the default `all` imports every one."""
    parser = argparse.ArgumentParser(prog="msprobe", description="Precision debugging for PyTorch and MindSpore.")
    parser.add_argument("--version", action="version", version=f"msprobe {msprobe.__version__}")
    options.add_framework(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, path, aliases in COMMANDS:
        if command is all or name == command:
            module, error = _load(path)
            doc = (module.__doc__ or "").strip() if module else f"unavailable: {error}"
        else:
            module, error, doc = None, None, _docstring(path).strip()
        p = sub.add_parser(name, aliases=list(aliases), help=HELP.get(name) or (_summary(doc) if doc else name),
                           description=doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if module is not None:
            module.add_arguments(p)
        p.set_defaults(_module=module, _error=error, _parser=p)
    return parser


def main(argv=None):
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_chosen(argv))
    args, extra = parser.parse_known_args(argv)
    if extra:  # a bad flag is the subcommand's: its own usage says what it takes
        (getattr(args, "_parser", None) or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not args.command:
        parser.print_help()
        return 0
    if args._module is None:
        print(f"msprobe {args.command}: unavailable: {args._error}", file=sys.stderr)
        return 1
    try:
        code = args._module.run(args) or 0
        sys.stdout.flush()  # here, not at exit: a reader that left (`| head`) is handled below
        return code
    except MsprobeError as e:
        print(f"msprobe {args.command}: {_unprefixed(str(e))}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `msprobe ... | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())

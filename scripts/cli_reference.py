"""Write docs/cli.md, the command-line reference, from the `msprobe` parser itself (every subcommand's
help text and options), so the page cannot drift from the code; tests/cli/test_readme_commands.py checks
that it is up to date.

    python scripts/cli_reference.py [--out docs/cli.md]
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WIDTH = "100"  # argparse wraps at $COLUMNS: a fixed width makes the page the same on every machine


def cli_reference():
    """The page's Markdown text."""
    os.environ["COLUMNS"] = WIDTH
    from msprobe.cli.main import COMMANDS, build_parser
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = [[name, *aliases] for name, _, aliases in COMMANDS]  # a command and its aliases
    lines = ["# Command line reference", "",
             "Generated from the parser by `python scripts/cli_reference.py`; the same text as `msprobe COMMAND -h`.",
             "Every command takes `-f/--framework` before it for msProbe compatibility (the framework is read",
             "from the dump).", ""]
    lines += [f"- [`{names[0]}`](#{names[0]})" + (f" (alias {', '.join(f'`{n}`' for n in names[1:])})"
                                                  if len(names) > 1 else "")
              for names in commands]
    for names in commands:
        lines += ["", f"## {names[0]}", ""]
        if len(names) > 1:
            lines += [f"Alias: {', '.join(f'`msprobe {n}`' for n in names[1:])}.", ""]
        lines += ["```", subparsers.choices[names[0]].format_help().rstrip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "cli.md"))
    args = parser.parse_args(argv)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(cli_reference())
    print(f"wrote {os.path.abspath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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


# what each command calls: a Python program gets the same files and results without the command line
PYTHON = """## The same from Python

| command | Python |
|---|---|
| `summary -i P` | `format_summary(summarize_dump(P))` (`msprobe.core.dump.summary`) |
| `compare -tp T -gp G -o O` | `write_compare(T, G, O)` (`msprobe.core.compare.outputs`); printout `format_diagnosis(out.diagnosis)` (`msprobe.core.diagnosis`) |
| `compare -i compare.json` | `cfg = read_compare_json(path)` (`msprobe.core.compare.compare_json`), then `write_compare(cfg.npu_path, cfg.bench_path, O, stack_path=cfg.stack_path, engine=cfg.engine or "pool", address=cfg.address)` |
| `overflow_check -i P -o O` | `a = analyze_overflow(P)` (`msprobe.core.overflow`); `write_analysis_json(a, O)`, `format_analysis(a)` (`msprobe.core.overflow.report`) |
| `grad_compare A B -o O` | `cmps = compare_grad_runs(A, B)` (`msprobe.core.grad_probe.compare`); `write_comparison(cmps, O, THRESHOLD, DROP)` (`msprobe.core.grad_probe.report`) |
| `monitor_report -i P -o O` | `build_report(P, O)` (`msprobe.core.monitor.report`) |
| `graph_visualize -tp T -gp G -o O` | `visualize(T, O, golden_path=G)` (`msprobe.core.graph.build`) |
| `graph -i compare.json` | `cfg = read_compare_json(path, golden_required=False)`, then `visualize(cfg.npu_path, O, golden_path=cfg.bench_path, stack_path=cfg.stack_path)` |
| `acc_check -api_info D -o O` | `run_acc_check(D, out_path=O)` (`msprobe.pytorch.acc_check`, also for MindSpore dumps); `format_summary(report)` (`msprobe.core.acc_check.summary`) |
| `multi_acc_check -api_info D -d 0 1` | `run_multi_acc_check(D, devices=[0, 1])`: it asks the framework for the device count and picks the start method itself |"""


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
    lines += ["", "Without `-o` every command writes under `./output`, as msProbe's compare does; acc_check and",
              "multi_acc_check write to `./` (the working directory), as msProbe's do.", "", PYTHON]
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

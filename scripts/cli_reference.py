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
| `summary -i P` | `format_summary(summarize_dump(P, skipped=lines))` (`msprobe.core.dump.summary`); exit 1: `lines` (the steps and ranks left out) |
| `compare -tp T -gp G -o O` | `out = write_compare(T, G, O)` (`msprobe.core.compare.outputs`); printout `format_diagnosis(out.diagnosis)` (`msprobe.core.diagnosis`), `--brief`: `format_diagnosis(out.diagnosis, brief=True)`; the first warning: `out.diagnosis.unmatched` |
| compare's options | `write_compare` keywords of the same names: `xlsx`, `precision`, `fuzzy_match`, `data_mapping`, `cell_mapping`, `api_mapping`, `layer_mapping`, `workers`, `target_run`, `golden_run`, `engine`, `address`, `resume`; `-tensor_log`: `keep_tables=True`, then each `r.rows.verdicts` of `out.results` (`result[i]`, `messages(i)`) |
| compare's exit code | 2 with `--fail-on-divergence`: `out.failed` (a divergence, or dumps that mostly do not match); 1: `out.failed_pairs` (the pairs not compared, one line each) |
| `compare -i compare.json` | `cfg = read_compare_json(path)` (`msprobe.core.compare.compare_json`), then `write_compare(cfg.npu_path, cfg.bench_path, O, stack_path=cfg.stack_path, engine=cfg.engine or "pool", address=cfg.address)` |
| `overflow_check -i P -o O` | `a = analyze_overflow(P)` (`msprobe.core.overflow`); `write_analysis_json(a, O)`, `format_analysis(a)` (`msprobe.core.overflow.report`); exit 1: `a.skipped` |
| `grad_compare A B -o O` | `cmps = compare_grad_runs(A, B, threshold, drop)` (`msprobe.core.grad_probe.compare`; defaults `THRESHOLD`, `DROP`); `write_comparison(cmps, O, threshold, drop)` (`msprobe.core.grad_probe.report`; `--no-plots`: `plots=False`), `format_comparison(cmps)` |
| `monitor_report -i P -o O` | `build_report(P, O)` (`msprobe.core.monitor.report`; `--ops norm,mean`: `ops=["norm", "mean"]`) |
| `graph_visualize -tp T -gp G -o O` | `out = visualize(T, O, golden_path=G)` (`msprobe.core.graph.build`; `layer_mapping`, `fuzzy_match`, `overflow_check`, `target_run`, `golden_run` as the options); exit 1: `out.skipped` |
| `graph -i compare.json` | `cfg = read_compare_json(path, golden_required=False)`, then `visualize(cfg.npu_path, O, golden_path=cfg.bench_path, stack_path=cfg.stack_path)` |
| `acc_check -api_info D -o O` | `report = run_acc_check(D, out_path=O)` (`msprobe.pytorch.acc_check`, also for MindSpore dumps); `format_summary(report)` (`msprobe.core.acc_check.summary`); `-d`, `-csv_path`, `-save_error_data`, `--custom_api`, `--seed`, `--max-elements`: `device`, `resume_csv`, `save_error_data`, `custom_apis`, `seed`, `max_elements` |
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

"""benchmarks/RESULTS.md, where the benchmarks keep their latest numbers: run with `--record`, a benchmark
replaces its own `## {script}` section with what it printed to stdout (its tables), the command line,
the date and the machine. Sections of other benchmarks are left as they are.
"""

import contextlib
import io
import os
import platform
import re
import sys
import time

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")


def add_record_option(parser):
    parser.add_argument("--record", action="store_true",
                        help="replace this benchmark's section of benchmarks/RESULTS.md with the tables it prints")


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self):
        for s in self.streams:
            s.flush()


@contextlib.contextmanager
def recording(script, enabled, argv=None, path=RESULTS, heading=None):
    """Within the block, stdout is also kept; at its end (when `enabled`) it becomes `script`'s section
    (or the section `heading`: one script measuring on two kinds of machine keeps two)."""
    if not enabled:
        yield
        return
    kept = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, kept)):
        yield
    args = " ".join(a for a in (sys.argv[1:] if argv is None else argv) if a != "--record")
    write_section(heading or script, kept.getvalue(), f"python benchmarks/{script} {args}".strip(), path)


def write_section(heading, printed, command, path=RESULTS):
    """Replace (or append) the `## {heading}` section of `path` with `printed` as a code block."""
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    section = (f"## {heading}\n\n`{command}`, {time.strftime('%Y-%m-%d')}, {machine}:\n\n"
               f"```\n{printed.strip()}\n```\n")
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmark results\n"
    found = re.search(rf"^## {re.escape(heading)}\n.*?(?=^## |\Z)", text, re.M | re.S)
    if found is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        rest = text[found.end():]
        text = text[:found.start()] + section + ("\n" + rest if rest else "")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def run_recorded(script, main, heading=None):
    """A benchmark's entry point: `main()` with `--record` taken off the command line, its printed tables
    recorded in RESULTS.md (section `heading`, default the script's name) when `--record` was there.
    Returns main's exit status."""
    argv = sys.argv[1:]
    record = "--record" in argv
    sys.argv[1:] = [a for a in argv if a != "--record"]
    with recording(script, record, sys.argv[1:], heading=heading):
        return main()

"""benchmarks/RESULTS.md: each benchmark writes its own `## ` section (the latest run), others are kept."""

import datetime
import os
import platform
import re

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")
HEAD = ("# Benchmark results\n\nWritten by the scripts in this folder: each run replaces its own section. "
        "Ratios are measured in one run of a script (a baseline beside every configuration).\n")


def machine():
    """One line naming where the numbers come from."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def update_section(title, body, path=PATH, where=None):
    """Replace (or add) the section `## {title}` with `body`, stamped with the date and `where` the
    numbers come from (default: this machine)."""
    stamp = datetime.date.today().isoformat()
    section = f"## {title}\n\n_{stamp}, {where or machine()}_\n\n{body.strip()}\n"
    text = open(path, encoding="utf-8").read() if os.path.exists(path) else HEAD
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.rstrip("\n") + "\n")

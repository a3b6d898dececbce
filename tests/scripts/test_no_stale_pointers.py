"""Every `name.py` the docs, the benchmarks and the framework-free source point to exists: a module renamed,
split or removed leaves no pointer behind (the benchmarks README's list of removed investigations names
scripts that are gone on purpose)."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIP_DIRS = {".git", ".venv", "build", "node_modules", "__pycache__", "demo_out", "dump_path"}
# files a run writes (acc_check's reproduce.py), that examples name as the user's own, or placeholders
NOT_OURS = {"reproduce.py", "model.py", "worker.py", "file.py", "train.py", "X.py", "test_X.py"}
REMOVED_SECTION = "## Investigations whose scripts were removed"
_PY = re.compile(r"(?<![\w./-])([\w./-]*[A-Za-z_]\w*\.py)\b")


def _our_files():
    names, paths = set(), set()
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith(".")]
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, "/")
            names.add(f)
            parts = rel.split("/")
            paths.update("/".join(parts[i:]) for i in range(len(parts)))
    return names, paths


def _pointing_files():
    yield from (os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs"))) if f.endswith(".md"))
    yield "README.md"
    for folder in ("benchmarks", os.path.join("src", "msprobe", "core"), os.path.join("src", "msprobe", "cli")):
        for d, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in sorted(files):
                if f.endswith((".py", ".md", ".sh")) and f != "RESULTS.md":
                    yield os.path.relpath(os.path.join(d, f), ROOT)


def test_every_py_file_named_exists():
    names, paths = _our_files()
    stale = []
    for rel in _pointing_files():
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            text = f.read()
        if REMOVED_SECTION in text:
            head, _, rest = text.partition(REMOVED_SECTION)
            text = head + rest[rest.find("\n## "):] if "\n## " in rest else head
        for n, line in enumerate(text.splitlines(), 1):
            for m in _PY.finditer(line):
                ref = m.group(1).lstrip("./")
                if ref in paths or os.path.basename(ref) in names or os.path.basename(ref) in NOT_OURS:
                    continue
                stale.append(f"{rel}:{n}: {ref}")
    assert not stale, "pointers to files that do not exist:\n" + "\n".join(stale)

"""The README and docs/ as a user pastes from them: every `msprobe ...` command in a bash block is a real
subcommand with real flags, every Python block compiles, docs/cli.md is what the parser says, the README's
links lead to files that exist, and the five-minute tour runs as written."""

import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ["README.md"] + [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                         if f.endswith(".md")]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks(page, language):
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    return [body for lang, body in BLOCK.findall(text) if lang == language]


def msprobe_commands(page):
    """Each `msprobe ...` line of the page's bash blocks, without its comment and `[optional]` parts."""
    for body in blocks(page, "bash"):
        for line in body.splitlines():
            line = re.sub(r"\[[^\]]*\]", "", line)
            words = shlex.split(line, comments=True)
            if words and words[0] == "msprobe":
                yield line, words[1:]


@pytest.mark.parametrize("page", PAGES)
def test_msprobe_commands_are_real(page):
    from msprobe.cli.main import build_parser
    parser = build_parser()
    for line, argv in msprobe_commands(page):
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page}: not a valid msprobe command: {line.strip()}")
        assert argv == ["-h"] or args.command, line


@pytest.mark.parametrize("page", PAGES)
def test_python_blocks_compile(page):
    for i, body in enumerate(blocks(page, "python")):
        compile(body, f"{page} python block {i}", "exec")


def test_cli_reference_is_up_to_date():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        from cli_reference import cli_reference
    finally:
        sys.path.pop(0)
    page = open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8").read()
    assert page == cli_reference(), "docs/cli.md is stale: run python scripts/cli_reference.py"


def test_readme_links_lead_somewhere():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert os.path.exists(os.path.join(ROOT, target)), target


def test_tour_runs_as_written(tmp_path):
    """The tour's first block, pasted into bash in a fresh directory (the checkout's examples/ linked in,
    `python` and `msprobe` being this interpreter's), then its second block."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    tour = text[text.index("## A five-minute tour"):text.index("## Installing")]
    bash = [body for lang, body in BLOCK.findall(tour) if lang == "bash"]
    assert len(bash) == 2
    os.symlink(os.path.join(ROOT, "examples"), tmp_path / "examples")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python")
    (bin_dir / "msprobe").write_text(f'#!/bin/sh\nexec {sys.executable} -m msprobe.cli.main "$@"\n')
    (bin_dir / "msprobe").chmod(0o755)
    # one OpenMP/BLAS thread: the tour's models are tiny, and idle pool threads only spin on a busy machine
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    script = "set -e\n" + "\n".join(line for body in bash for line in body.splitlines()
                                    if not line.startswith("source "))
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Error is introduced in forward at Functional.softmax.1.forward" in proc.stdout
    assert list((tmp_path / "graph_out").glob("compare_*.html"))
    assert list((tmp_path / "acc_out").glob("accuracy_checking_result_*.csv"))
    assert "First anomaly: step 12," in (tmp_path / "monitor_report" / "index.html").read_text()

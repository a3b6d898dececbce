"""A run cut short leaves one step's dump.json truncated: compare, graph_visualize, overflow_check and
summary still analyse every other step, name the damaged one in one line on stderr, and exit 1."""

import glob
import os
import shutil
import subprocess
import sys

import pytest

from msprobe.core.dump.summary import summarize_dump
from msprobe.core.errors import EXIT_PARTIAL, DumpFormatError
from private_modules import load_private

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTIAL = EXIT_PARTIAL


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
    """(target root with step1's dump.json cut in half, golden root), 3 steps at level mix."""
    pytest.importorskip("torch")
    runs = load_private("msprobe_compare_test_runs", os.path.join(TESTS, "compare", "runs.py"))
    root = tmp_path_factory.mktemp("partial")
    golden = runs.dump(root / "g", "fp32", "statistics", steps=3)
    target = str(root / "t")
    shutil.copytree(runs.dump(root / "t0", "perturbed", "statistics", steps=3), target)
    damaged = runs.dump_json(target, step=1)
    with open(damaged, "rb") as f:
        raw = f.read()
    with open(damaged, "wb") as f:
        f.write(raw[: len(raw) // 2])
    return target, golden


def msprobe(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "msprobe.cli.main", *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def assert_step1_named(proc):
    assert proc.returncode == PARTIAL, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("step 1 rank 0: skipped: "), proc.stderr
    assert "step1" in lines[0] and "not valid JSON" in lines[0] and "Traceback" not in proc.stderr


def test_compare_compares_the_other_steps(three_steps, tmp_path):
    target, golden = three_steps
    proc = msprobe("compare", "-tp", target, "-gp", golden, "-o", tmp_path, "--no-progress")
    assert_step1_named(proc)
    written = sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "compare_result_*.csv")))
    assert [name.split("_")[2] for name in written] == ["step0", "step2"]
    assert "step 2 rank 0: statistics compare" in proc.stdout


def test_graph_draws_the_other_steps(three_steps, tmp_path):
    target, golden = three_steps
    for extra in ((), ("-gp", golden)):
        proc = msprobe("graph_visualize", "-tp", target, *extra, "-o", tmp_path / str(len(extra)), "--no-progress")
        assert_step1_named(proc)
        assert "2 graph(s)" in proc.stdout


def test_overflow_check_checks_the_other_steps(three_steps, tmp_path):
    proc = msprobe("overflow_check", "-i", three_steps[0], "-o", tmp_path, "--no-progress")
    assert_step1_named(proc)
    assert "(2 rank directories checked)" in proc.stdout
    assert glob.glob(str(tmp_path / "anomaly_analyze_*.json"))


def test_summary_summarises_the_other_steps(three_steps):
    proc = msprobe("summary", "-i", three_steps[0])
    assert_step1_named(proc)
    assert "step0/rank0" in proc.stdout and "step2/rank0" in proc.stdout and "step1/" not in proc.stdout


def test_nothing_readable_is_still_one_error(three_steps, tmp_path):
    proc = msprobe("summary", "-i", os.path.join(three_steps[0], "step1"))
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    # the rule is the Python API's: the one error, said the same way; of several, the first line
    with pytest.raises(DumpFormatError) as e:
        summarize_dump(os.path.join(three_steps[0], "step1"), skipped=[])
    assert proc.stderr.strip() == f"msprobe summary: {e.value}" and "not valid JSON" in str(e.value)
    two = tmp_path / "two"
    for rank in (0, 1):
        shutil.copytree(os.path.join(three_steps[0], "step1", "rank0"), two / "step1" / f"rank{rank}")
    skipped = []
    with pytest.raises(DumpFormatError, match=r"^no rank directory could be read; first: step 1 rank 0: skipped: "):
        summarize_dump(str(two), skipped=skipped)
    assert len(skipped) == 2
    proc = msprobe("graph_visualize", "-tp", two, "-o", tmp_path / "g", "--no-progress")
    assert proc.returncode == 1 and proc.stderr.startswith("msprobe graph_visualize: no rank directory could be "
                                                           "read; first: step 1 rank 0: skipped: "), proc.stderr

"""benchmarks/results_file.py: `--record` replaces the benchmark's own section of RESULTS.md with what it
printed, and leaves the other sections alone."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "benchmarks"))
import results_file  # noqa: E402


def test_record_replaces_only_its_section(tmp_path, capsys):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n\nintro\n\n## a.py\n\nold a\n\n## b.py\n\nold b\n")
    with results_file.recording("a.py", True, ["--rounds", "3", "--record"], path=str(path)):
        print("config  ratio\nstat_L1 1.2x")
    assert "stat_L1 1.2x" in capsys.readouterr().out            # still printed
    text = path.read_text()
    assert text.startswith("# Benchmark results\n\nintro\n\n## a.py\n\n`python benchmarks/a.py --rounds 3`, ")
    assert "```\nconfig  ratio\nstat_L1 1.2x\n```\n" in text and "old a" not in text
    assert text.endswith("\n## b.py\n\nold b\n")
    results_file.write_section("c.py", "x 1\n", "python benchmarks/c.py", str(path))   # a new section: appended
    text = path.read_text()
    assert text.endswith("## c.py\n\n`python benchmarks/c.py`, " + text.split("`python benchmarks/c.py`, ")[1])
    assert "\n## b.py\n\nold b\n\n## c.py\n" in text
    with results_file.recording("b.py", False, [], path=str(path)):
        print("not recorded")
    assert "old b" in path.read_text()

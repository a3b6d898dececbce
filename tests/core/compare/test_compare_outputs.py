"""What `msprobe compare` writes and says, from the command line and from Python alike: the same files
and verdict; reruns into one dump_path paired newest with newest, said in one line; two dumps that
mostly do not match said first and failing --fail-on-divergence; the whole diagnosis printed, or one
line with --brief; processes called processes."""

import glob
import json
import os
import re
import subprocess
import sys
import time

import pytest

from private_modules import load_private

pytest.importorskip("torch")

from msprobe.core.compare.outputs import write_compare  # noqa: E402
from msprobe.core.diagnosis import format_diagnosis  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
planted = load_private("msprobe_test_planted", os.path.join(TESTS, "compare", "planted.py"))


def msprobe(*args):
    return subprocess.run([sys.executable, "-m", "msprobe.cli.main", *args], capture_output=True, text=True,
                          timeout=300)


def _names(folder):
    return sorted(re.sub(r"_\d{14}", "", os.path.basename(p)) for p in glob.glob(os.path.join(folder, "*")))


def test_python_api_writes_what_the_command_writes(dumps, tmp_path):
    target, golden = dumps("perturbed", "statistics", steps=2), dumps("fp32", "statistics", steps=2)
    cli = msprobe("compare", "-tp", target, "-gp", golden, "-o", str(tmp_path / "cli"), "--no-progress",
                  "--fail-on-divergence")
    out = write_compare(target, golden, str(tmp_path / "api"), progress=False)
    assert _names(tmp_path / "cli") == _names(tmp_path / "api") == [
        "compare_result_step0_rank0.csv", "compare_result_step1_rank0.csv", "diagnosis.json"]
    with open(tmp_path / "cli" / "diagnosis.json") as a, open(out.diagnosis_path) as b:
        assert json.load(a) == json.load(b)
    assert cli.returncode == (2 if out.failed else 0) == 2
    assert not out and out.divergence and [os.path.basename(f)[:30] for f in out.files] == [
        "compare_result_step0_rank0_202", "compare_result_step1_rank0_202"]
    for r in out.results:  # the files hold the Diagnosis column the result tables hold
        with open(r.output_path) as f:
            assert "Diagnosis" in f.readline().split(",")


@pytest.fixture(scope="module")
def rerun_dumps(tmp_path_factory):
    """A dump_path written twice without a process group (proc{pid} dirs): first with a perturbed weight,
    then clean; and a clean golden. The first run's dir is renamed as another process's would be."""
    root = tmp_path_factory.mktemp("reruns")
    target, golden = root / "target", root / "golden"
    planted.dump_run(target, "weight", rank=None)
    (own,) = (target / "step0").iterdir()
    old = target / "step0" / "proc1"
    own.rename(old)
    an_hour_ago = time.time() - 3600
    os.utime(old / "dump.json", (an_hour_ago, an_hour_ago))
    planted.dump_run(target, None, rank=None)
    planted.dump_run(golden, None, rank=None)
    return str(target), str(golden), own.name


def test_reruns_pair_newest_with_newest_and_say_so(rerun_dumps, tmp_path):
    target, golden, newest = rerun_dumps
    proc = msprobe("compare", "-tp", target, "-gp", golden, "-o", str(tmp_path / "a"), "--no-progress",
                   "--fail-on-divergence")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the newest run is the clean one
    first = proc.stdout.splitlines()[0]
    assert first.startswith("step 0: target holds 2 runs (proc1 ") and f"{newest} " in first
    assert f"comparing target {newest} with golden {newest} (the newest with the newest;" in first
    assert f"step 0 process {newest[4:]}: statistics compare" in proc.stdout
    assert "rank" not in proc.stdout.replace("--target-run", "")  # a process id is not a rank


def test_an_older_run_is_compared_when_asked(rerun_dumps, tmp_path):
    target, golden, _ = rerun_dumps
    proc = msprobe("compare", "-tp", target, "-gp", golden, "-o", str(tmp_path / "b"), "--no-progress",
                   "--target-run", "proc1", "--fail-on-divergence")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "comparing target proc1 with golden" in proc.stdout and "(as asked;" in proc.stdout
    d = json.loads((tmp_path / "b" / "diagnosis.json").read_text())
    assert d["suspects"][0]["api"] == planted.EXPECTED["weight"][0]
    assert d["suspects"][0]["is_proc"] is True


def test_an_unknown_run_is_refused_with_the_list(rerun_dumps, tmp_path):
    target, golden, newest = rerun_dumps
    proc = msprobe("compare", "-tp", target, "-gp", golden, "-o", str(tmp_path / "c"), "--target-run", "proc7")
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("msprobe compare: --target-run 'proc7': no such run in step 0; runs there: 2 runs (proc1 ")
    assert newest in line and "allowed: one of those names, or 'all'" in line


def test_dumps_that_mostly_do_not_match_say_so_first_and_fail(dumps, tmp_path):
    """Two different models: few rows pair; that is the first thing said, and a failure for CI."""
    other = planted.dump_run(tmp_path / "planted", None)
    target = dumps("fp32", "statistics")
    proc = msprobe("compare", "-tp", target, "-gp", other, "-o", str(tmp_path / "o"), "--no-progress",
                   "--fail-on-divergence")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.startswith("warning: the dumps mostly do not match: ")
    d = json.loads((tmp_path / "o" / "diagnosis.json").read_text())
    assert d["mostly_unmatched"] is True and d["verdict"].startswith("the dumps mostly do not match")
    # the printout's headline is the unmatched clause, its next line the rest of the verdict: from the
    # typed Diagnosis, and the same from diagnosis.json read back
    clause, rest = d["verdict"].split("; ", 1)
    lines = proc.stdout.splitlines()
    assert lines[0] == f"warning: {clause}"
    headline = lines.index(f"Diagnosis: {clause}.")
    assert lines[headline + 1] == f"  then:    {rest}"
    assert format_diagnosis(d) in proc.stdout
    assert msprobe("compare", "-tp", target, "-gp", other, "-o", str(tmp_path / "p"), "--no-progress").returncode == 0


def test_the_whole_diagnosis_is_printed_and_brief_is_one_line(tmp_path):
    golden = planted.dump_run(tmp_path / "g", None, level="L1")
    target = planted.dump_run(tmp_path / "t", "bf16_softmax+weight", level="L1")
    full = msprobe("compare", "-tp", target, "-gp", golden, "-o", str(tmp_path / "a"), "--no-progress")
    d = json.loads((tmp_path / "a" / "diagnosis.json").read_text())
    assert len(d["suspects"]) >= 2
    text = full.stdout
    assert text == "".join(line + "\n" for line in text.splitlines())
    assert format_diagnosis(d) in text  # all of it: every suspect, every evidence row
    for i, s in enumerate(d["suspects"], 1):
        block = text.split(f"Evidence for #{i} ({s['api']}")[1].split("Evidence for #")[0]
        rows = s["inputs"] + s["outputs"]
        assert rows and all(r["name"].split(".")[-2] in block for r in rows)  # no empty header at L1
    brief = msprobe("compare", "-tp", target, "-gp", golden, "-o", str(tmp_path / "b"), "--no-progress",
                    "--brief")
    lines = brief.stdout.splitlines()
    assert lines[-2] == f"Diagnosis: {d['verdict']}." and lines[-1].startswith("diagnosis -> ")
    assert not any(line.startswith("Evidence") for line in lines)

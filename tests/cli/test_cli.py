"""The installed `msprobe` console script and the README demo, run as a user would."""

import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MSPROBE = shutil.which("msprobe", path=os.path.dirname(sys.executable)) or shutil.which("msprobe")


def run(*args, **kw):
    return subprocess.run([MSPROBE, *args], capture_output=True, text=True, timeout=120, **kw)


def test_help_and_version_work_without_frameworks():
    # -h must not import torch: run it with torch made unimportable
    code = ("import sys; sys.modules['torch'] = None; sys.modules['mindspore'] = None; "
            "from msprobe.cli.main import main; sys.argv = ['msprobe', '-h']; main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "summary" in out.stdout
    ver = run("--version")
    assert ver.returncode == 0 and ver.stdout.startswith("msprobe ")


def test_help_imports_no_subcommand_module():
    """`msprobe -h` lists every command from the modules' source; `msprobe compare -h` imports compare only."""
    code = ("import sys, contextlib, io\nfrom msprobe.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try:\n        main(sys.argv[1:])\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('msprobe.cli.') and m != 'msprobe.cli.main' "
            "and m != 'msprobe.cli.options'))\nprint(out.getvalue())")
    env = {**os.environ, "COLUMNS": "200"}
    top = subprocess.run([sys.executable, "-c", code, "-h"], capture_output=True, text=True, timeout=60, env=env)
    assert top.returncode == 0, top.stderr
    assert top.stdout.startswith("[]\n"), top.stdout
    for line in ("grad_compare", "Compare a target dump with a golden dump, tensor by tensor",
                 "multi_acc_check (multi_run_ut)"):
        assert line in top.stdout, top.stdout
    one = subprocess.run([sys.executable, "-c", code, "compare", "-h"], capture_output=True, text=True, timeout=60,
                         env=env)
    assert one.stdout.startswith("['msprobe.cli.compare']\n") and "--fail-on-divergence" in one.stdout, one.stdout


def test_summary_of_missing_dump_is_one_clear_line(tmp_path):
    out = run("summary", "-i", str(tmp_path))
    assert out.returncode == 1
    assert "no dump found" in out.stderr and "Traceback" not in out.stderr


def test_summary_reads_a_truncated_dump_json_as_a_clear_error(tmp_path):
    rank = tmp_path / "step0" / "rank0"
    rank.mkdir(parents=True)
    (rank / "dump.json").write_text('{"task": "statistics", "data": {"a": ')
    out = run("summary", "-i", str(tmp_path))
    assert out.returncode == 1
    assert "dump.json" in out.stderr and "not valid JSON" in out.stderr and "Traceback" not in out.stderr


def test_demo_dumps_two_runs_and_summarises_them(tmp_path):
    out_dir = tmp_path / "demo"
    res = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "demo.py"), "--out", str(out_dir)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "== fp32" in res.stdout and "== planted" in res.stdout
    for run_name in ("fp32", "planted"):
        dumps = list((out_dir / run_name / "step0").glob("proc*/dump.json"))
        assert len(dumps) == 1
        doc = json.loads(dumps[0].read_text())
        assert doc["level"] == "mix" and doc["framework"] == "pytorch"
        assert "Functional.softmax.0.forward" in doc["data"]
    # the planted run casts block 1's scores to bf16: the dump shows the extra casts
    planted = json.loads(next((out_dir / "planted" / "step0").glob("proc*/dump.json")).read_text())["data"]
    softmax_inputs = [v["input_args"][0]["dtype"] for k, v in planted.items()
                      if k.startswith("Functional.softmax.") and k.endswith(".forward")]
    assert softmax_inputs == ["torch.float32", "torch.bfloat16"]
    summary = run("summary", "-i", str(out_dir / "fp32"))
    assert summary.returncode == 0 and "level=mix" in summary.stdout


def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
    assert "make test" in readme.split("\n## ")[0] and "make demo" in readme.split("\n## ")[0]
    assert "make test" in ci

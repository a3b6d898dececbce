"""Custom APIs checked without `--custom_api`: `register_custom_api` records where each API lives in the
dump's api_sources.json (beside dump.json, which keeps msProbe's layout), and acc_check imports it from
there; an API defined in the training script itself is skipped saying how to point at it."""

import csv
import json
import os
import subprocess
import sys
import textwrap

import pytest

from acc_fixtures import dump_json_of, lowprec_dump

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + sys.path))


def acc_check(dump, out, *extra):
    """The command as a user runs it, with no --custom_api."""
    proc = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "acc_check", "-api_info", str(dump), "-o",
                           str(out), "--no_progress", *extra], capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr
    with open(next(out.glob("accuracy_checking_result_*.csv")), encoding="utf-8-sig", newline="") as f:
        return {r["API Name"]: r for r in csv.DictReader(f)}, proc.stdout


def check_sources_and_verdicts(dump, tmp_path, module):
    rank_dir = os.path.dirname(dump)
    sources = json.load(open(os.path.join(rank_dir, "api_sources.json")))
    assert sources["custom_apis"]["LowPrec.matmul_fp16_inside"] == {"module": module, "attribute": "matmul_fp16_inside"}
    doc = json.load(open(dump))
    assert set(doc) == {"task", "level", "framework", "dump_data_dir", "data"}   # dump.json stays msProbe's
    result, _ = acc_check(dump, tmp_path / "out", "-save_error_data")
    assert result["LowPrec.matmul_fp16_inside.0"]["Forward Test Success"] == "error"
    assert result["LowPrec.matmul_exact.0"]["Forward Test Success"] == "pass"
    # the failing API's error data carries its part of api_sources.json: reproduce.py needs no flag
    case_dir = tmp_path / "out" / "error_data" / "LowPrec.matmul_fp16_inside.0"
    assert list(json.load(open(case_dir / "api_sources.json"))["custom_apis"]) == ["LowPrec.matmul_fp16_inside"]
    rep = subprocess.run([sys.executable, str(case_dir / "reproduce.py")], capture_output=True, text=True,
                         timeout=300, env=ENV)
    assert rep.returncode == 0 and "forward error" in rep.stdout, rep.stderr


@pytest.mark.parametrize("framework, module", [("pytorch", "lowprec_ops"), ("mindspore", "ms_lowprec_ops")])
def test_custom_api_is_found_from_the_dump(framework, module, tmp_path):
    pytest.importorskip("torch" if framework == "pytorch" else "mindspore")
    check_sources_and_verdicts(lowprec_dump(framework, tmp_path / "dump"), tmp_path, module)


def test_api_defined_in_the_training_script_says_how_to_point_at_it(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch
        from msprobe.pytorch import PrecisionDebugger

        def fused(a):
            return a * 2

        dbg = PrecisionDebugger(dump_path={str(tmp_path / "dump")!r}, level="L1", task="statistics")
        dbg.register_custom_api(sys.modules[__name__], "fused", "MyOps")
        dbg.start()
        fused(torch.ones(3))
        dbg.stop()
        dbg.step()
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr
    result, stdout = acc_check(dump_json_of(tmp_path / "dump"), tmp_path / "out")
    message = result["MyOps.fused.0"]["Message"]
    assert result["MyOps.fused.0"]["Forward Test Success"] == "SKIP"
    assert "main script" in message and "--custom_api MyOps=" in message
    assert f"MyOps.fused.0: {message}" in stdout

"""The README demo ends with the compare of its two dumps and the diagnosis naming the planted softmax."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_demo_compares_and_names_the_planted_softmax(tmp_path):
    res = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "demo.py"), "--out", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    tail = res.stdout.split("== compare planted vs fp32", 1)[1]
    assert "(statistics mode)" in tail
    table, diagnosis = tail.split("Diagnosis:", 1)
    assert "Functional.softmax.1.forward.input.0 torch.bfloat16 torch.float32" in " ".join(table.split())
    first_line = diagnosis.splitlines()[0]
    assert "divergence" in first_line and "Functional.softmax.1.forward" in first_line

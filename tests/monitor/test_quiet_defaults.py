"""The monitor's defaults on ordinary training: `examples/monitor_config.json` (every data type, every op,
both alert rules with their default thresholds) raises nothing in 20 steps of each example model (MLP,
transformer, CNN) of both frameworks, while a gradient spike and a NaN planted at one step are each the
first anomaly reported, at that step; `monitor_report`'s page opens with them, in time order."""

import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
MODELS = ("mlp", "transformer", "cnn")


def quiet_runs(framework, out_root):
    # one BLAS thread: the MindSpore monitor's numpy norms of small tensors otherwise wake OpenBLAS's pool
    # per call, about half the run's CPU time on two busy cores (the pytorch run sets torch's threads to one)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS] + sys.path), OPENBLAS_NUM_THREADS="1")
    res = subprocess.run([sys.executable, os.path.join(HERE, "quiet_runs.py"), framework, str(out_root)],
                         capture_output=True, text=True, timeout=400, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_normal_training_is_quiet_and_planted_faults_come_first(framework, tmp_path):
    pytest.importorskip(framework if framework == "mindspore" else "torch")
    report = quiet_runs(framework, tmp_path)
    plant_step = report["mlp-spike"]["steps"] - 1
    for model in MODELS:
        assert report[f"{model}-normal"]["anomalies"] == 0, report[f"{model}-normal"]["first"]
        for run, rule in (("spike", "AnomalyTurbulence"), ("nan", "AnomalyNan")):
            first = report[f"{model}-{run}"]["first"]
            assert first is not None and (first["step"], first["rule"]) == (plant_step, rule), (model, run, first)
    if framework == "pytorch":
        check_report_opens_with_first_anomalies(report["cnn-spike"]["output_root"], plant_step, tmp_path)


def check_report_opens_with_first_anomalies(monitor_dir, plant_step, tmp_path):
    out = tmp_path / "report"
    res = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "monitor_report", "-i", monitor_dir, "-o",
                          str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    page = (out / "index.html").read_text()
    assert str(out / "index.html") in res.stdout                  # the full path of what was written
    body = page[page.index("<body>"):]
    # the first thing after the title and the source line is the first anomaly, then the table in time order
    first_section = body[body.index("</p>") + 4:]
    assert re.match(rf"\s*<h2 id='anomalies'>Anomalies \(\d+\)</h2>\s*<p class='anomaly' id='first-anomaly'>"
                    rf"First anomaly: step {plant_step}, rank 0: ", first_section)
    steps = [int(s) for s in re.findall(r"<tr class='bad'><td>(\d+)</td>", body)]
    assert steps and steps[0] == plant_step and steps == sorted(steps)

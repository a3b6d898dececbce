"""`msprobe monitor_report` on real monitor output (a PyTorch run with a planted gradient blow-up, CSV and
TensorBoard) and on msProbe's sample CSVs: PNG charts, one HTML page naming every module and the
anomalies, and one-line errors for bad input."""

from pathlib import Path
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from msprobe.core.errors import ConfigError  # noqa: E402
from msprobe.core.monitor.ops import OPS  # noqa: E402
from msprobe.core.monitor.report import build_report  # noqa: E402
from msprobe.pytorch import TrainerMon  # noqa: E402

SAMPLES = str(Path(__file__).resolve().parents[1] / "data" / "msprobe-samples/monitor")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def planted_run(root, fmt):
    """7 SGD steps of a small MLP; at step 4 the loss (so every gradient) is scaled by 1e3."""
    os.environ["MONITOR_OUTPUT_DIR"] = str(root / f"out_{fmt}")
    cfg = root / f"cfg_{fmt}.json"
    cfg.write_text(json.dumps({"wg_distribution": True, "xy_distribution": True, "forward_only": True,
                               "ops": ["norm", "max"], "format": fmt,
                               "alert": {"rules": [{"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}}],
                                         "dump": True}}))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = TrainerMon(str(cfg))
    mon.set_monitor(model, 1, opt)
    x, y = torch.randn(16, 6), torch.randn(16, 3)
    try:
        for step in range(7):
            loss = nn.functional.mse_loss(model(x), y) * (1e3 if step == 4 else 1.0)
            loss.backward()
            opt.step()
            opt.zero_grad()
    finally:
        mon.close()
        del os.environ["MONITOR_OUTPUT_DIR"]
    return root / f"out_{fmt}", mon.anomalies


def msprobe(*args):
    return subprocess.run([sys.executable, "-m", "msprobe.cli.main", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    return root, {fmt: planted_run(root, fmt) for fmt in ("csv", "tensorboard")}


def check_report(report, anomalies):
    html = (report / "index.html").read_text()
    pngs = sorted((report / "png").glob("*.png"))
    # one trend chart (norm and max panels) per data type
    assert {p.name for p in pngs} == {f"rank0_{tag}_trend.png" for tag in ("actv", "grad_unreduced", "grad_reduced")}
    for p in pngs:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, p
        assert f"src='png/{p.name}'" in html                       # every chart is on the page
    for name in ("0.weight", "2.bias", "0.output", "2.input"):
        assert f"<td>{name}</td>" in html                          # per-module rows
    assert f"Anomalies ({len(anomalies)})" in html
    assert "0:0.weight/rank0/grad_reduced" in html
    # the module table lists the anomaly step of a blown-up parameter
    row = re.search(r"<tr class=\"bad\"><td>0\.weight</td>(.*?)</tr>", html)
    assert row and re.search(r"<td>4(, \d+)*</td>$", row.group(1)), row   # first anomaly at the blow-up
    # its per-module trends: a sparkline per op, the anomaly drawn as a red dot
    assert row.group(1).count("<svg") == 2 and 'class="anomaly-dot"' in row.group(1)
    quiet = re.search(r"<tr><td>0\.input</td>(.*?)</tr>", html)            # the fixed input never jumps
    assert quiet and quiet.group(1).count("<svg") == 2 and "anomaly-dot" not in quiet.group(1)
    return html


def test_report_from_csv(runs, tmp_path):
    root, results = runs
    out, anomalies = results["csv"]
    assert anomalies and min(a["step"] for a in anomalies) == 4
    res = msprobe("monitor_report", "-i", out, "-o", tmp_path / "rep")
    assert res.returncode == 0, res.stderr
    assert "monitor_report:" in res.stdout and f"{len(anomalies)} anomalies" in res.stdout
    check_report(tmp_path / "rep", anomalies)


def test_report_from_tensorboard_events(runs, tmp_path):
    root, results = runs
    out, anomalies = results["tensorboard"]
    assert not list(out.glob("*/*.csv"))
    res = msprobe("monitor_report", "-i", out, "-o", tmp_path / "rep")
    assert res.returncode == 0, res.stderr
    check_report(tmp_path / "rep", anomalies)


def test_report_from_one_rank_dir_and_msprobe_samples(tmp_path):
    rank_dir = tmp_path / "Nov21_08-54-28-rank0-d419d415"
    rank_dir.mkdir()
    for name in ("actv_1-1.csv", "exp_avg_sq_1-1.csv"):     # two data types keep the test quick
        shutil.copy(f"{SAMPLES}/{name}", rank_dir / name)
    (tmp_path / "anomaly_detected").mkdir()
    shutil.copy(f"{SAMPLES}/anomaly.json", tmp_path / "anomaly_detected" / "anomaly_0.json")
    res = msprobe("monitor_report", "-i", rank_dir, "-o", tmp_path / "rep", "--ops", "norm,mean")
    assert res.returncode == 0, res.stderr
    html = (tmp_path / "rep" / "index.html").read_text()
    n_records = len(json.load(open(f"{SAMPLES}/anomaly.json")))
    assert f"Anomalies ({n_records})" in html and "blocks.0.ln1.output" in html
    assert (tmp_path / "rep" / "png" / "rank0_exp_avg_sq_trend.png").read_bytes().startswith(PNG_MAGIC)
    # msProbe's records name their op only in the message; the mean anomaly of ln1.output is still marked
    assert re.search(r"<tr class=\"bad\"><td>blocks\.0\.ln1\.output</td>.*?<td>1(, \d+)*</td></tr>", html)


def test_bad_input_is_one_line(tmp_path):
    res = msprobe("monitor_report", "-i", tmp_path / "missing", "-o", tmp_path / "rep")
    assert res.returncode == 1 and "not a directory" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    res = msprobe("monitor_report", "-i", tmp_path / "empty", "-o", tmp_path / "rep")
    assert res.returncode == 1 and "no monitor data found" in res.stderr
    res = msprobe("monitor_report", "-i", tmp_path / "empty", "--ops", "norm,median")
    assert res.returncode == 1 and res.stderr.strip() == ("msprobe monitor_report: config field '--ops': got "
                                                          "'norm,median'; allowed: a comma list of " + ", ".join(OPS))
    with pytest.raises(ConfigError, match=r"^config field 'ops': got \['norm', 'median'\]; allowed: a comma list"):
        build_report(str(tmp_path / "empty"), str(tmp_path / "rep"), ops=["norm", "median"])  # the same rule
    bad = tmp_path / "bad" / "x-rank0-1"
    bad.mkdir(parents=True)
    (bad / "actv_0-0.csv").write_text("foo,bar\n1,2\n")
    res = msprobe("monitor_report", "-i", tmp_path / "bad", "-o", tmp_path / "rep")
    assert res.returncode == 1 and "missing columns name/step" in res.stderr


HOSTILE = "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>"


def test_a_hostile_anomaly_file_stays_text(tmp_path, browser):
    """Every string of an anomaly file (step, rank, series, message) is text on the page: parsed, the page
    has no element the file brought, and a real Chromium runs none of its script."""
    from html.parser import HTMLParser
    rank_dir = tmp_path / "Nov21_08-54-28-rank0-d419d415"
    rank_dir.mkdir()
    shutil.copy(f"{SAMPLES}/actv_1-1.csv", rank_dir / "actv_1-1.csv")
    (tmp_path / "anomaly_detected").mkdir()
    record = {"rank": HOSTILE, "step": HOSTILE, "call_id": HOSTILE, "tag_name": HOSTILE, "message": HOSTILE}
    sample = json.load(open(f"{SAMPLES}/anomaly.json"))
    (tmp_path / "anomaly_detected" / "anomaly_0.json").write_text(json.dumps({"evil": record, **sample}))
    res = msprobe("monitor_report", "-i", rank_dir, "-o", tmp_path / "rep")
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "rep" / "index.html").read_text()

    class Tags(HTMLParser):
        found = []

        def handle_starttag(self, tag, attrs):
            self.found.append((tag, dict(attrs)))
    parser = Tags()
    parser.feed(page)
    assert not [t for t, _ in parser.found if t == "script"]
    assert not [a for t, a in parser.found if t == "img" and not a.get("src", "").startswith("png/")]
    assert page.count(HOSTILE.replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")) >= 4
    view = browser.new_page()
    try:
        view.goto((tmp_path / "rep" / "index.html").as_uri())
        view.wait_for_timeout(300)
        assert view.evaluate("window.pwned") is None
        assert view.inner_text("body").count(HOSTILE) >= 4   # shown as the text it is
    finally:
        view.close()

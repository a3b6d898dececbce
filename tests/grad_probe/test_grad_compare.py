"""msprobe grad_compare on real training runs: a run perturbed at step 3 against a clean one, identical
runs, statistics-only (L0) runs, msProbe's unpacked bitmaps, and bad input."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from msprobe.core.errors import DumpFormatError, MsprobeError  # noqa: E402
from msprobe.core.grad_probe.compare import compare_grad_runs  # noqa: E402
from msprobe.core.grad_probe.config import grad_probe_config_from_dict  # noqa: E402
from msprobe.pytorch.grad_probe import GradientMonitor  # noqa: E402

STEPS = 7


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def train_run(out, level="L1", perturb_batch_at=None, lr_change_at=None):
    """SGD on fixed batches; optionally a different batch at one step, or a 20x lr from one update on."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g)) for _ in range(STEPS)]
    monitor = GradientMonitor(config=grad_probe_config_from_dict(
        {"task": "grad_probe", "dump_path": str(out), "grad_probe": {"grad_level": level}}))
    monitor.monitor(model)
    for step, (x, y) in enumerate(data):
        if step == perturb_batch_at:
            x = torch.randn(64, 16, generator=torch.Generator().manual_seed(99))
        if step == lr_change_at:
            for group in opt.param_groups:
                group["lr"] = 1.0
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    monitor.close()
    return str(out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    return {"base": train_run(tmp / "base"), "again": train_run(tmp / "again"),
            "batch3": train_run(tmp / "batch3", perturb_batch_at=3),
            # the lr of the update at step 2 changes: step 2's gradients are equal, step 3's are not
            "lr2": train_run(tmp / "lr2", lr_change_at=2),
            "base_L0": train_run(tmp / "base_L0", level="L0"), "batch3_L0": train_run(tmp / "batch3_L0", "L0", 3)}


def test_perturbed_batch_at_step3_diverges_at_step3(runs):
    [cmp] = compare_grad_runs(runs["base"], runs["batch3"])
    assert cmp.first_divergent_step == 3 and cmp.first_different_step == 3
    assert cmp.steps == list(range(STEPS))
    assert np.all(cmp.total[:3] == 1.0) and cmp.total[3] < 0.97
    assert set(cmp.param_divergence.values()) == {3}
    assert cmp.worst_params(3, 1)[0][1] == cmp.similarity[3].min()


def test_lr_change_diverges_at_the_first_gradient_it_touches(runs):
    [cmp] = compare_grad_runs(runs["base"], runs["lr2"])
    assert (cmp.first_divergent_step, cmp.first_different_step) == (3, 3)


def test_identical_runs_do_not_diverge(runs):
    [cmp] = compare_grad_runs(runs["base"], runs["again"])
    assert cmp.first_divergent_step is None and cmp.first_different_step is None
    assert np.all(cmp.similarity == 1.0) and not cmp.param_divergence


def test_statistics_only_runs_report_first_difference(runs):
    [cmp] = compare_grad_runs(runs["base_L0"], runs["batch3_L0"])
    assert not cmp.has_directions and cmp.first_divergent_step is None
    assert cmp.first_different_step == 3  # the MD5/Max/Min/Norm of step 3 differ


def test_msprobe_unpacked_bool_bitmaps(runs, tmp_path):
    """msProbe saved `grad > 0` as a bool array shaped like the parameter: the same similarities."""
    import shutil
    legacy = tmp_path / "legacy"
    shutil.copytree(runs["batch3"], legacy)
    for d, _, files in os.walk(legacy):
        for f in files:
            if f.endswith(".npy"):
                path = os.path.join(d, f)
                packed = np.load(path)
                np.save(path, np.unpackbits(packed)[:packed.size * 8].astype(bool)[:_numel(d, f)])
    [mine] = compare_grad_runs(runs["base"], runs["batch3"])
    [theirs] = compare_grad_runs(runs["base"], str(legacy))
    assert np.array_equal(mine.similarity, theirs.similarity)


def _numel(step_dir, fname):
    rank_dir = os.path.dirname(step_dir)
    step = os.path.basename(step_dir)[4:]
    with open(os.path.join(rank_dir, f"grad_summary_{step}.csv")) as f:
        row = next(r for r in csv.DictReader(f) if r["Param_name"] + ".npy" == fname)
    return int(np.prod(json.loads(row["Shape"])))


def _msprobe(*args):
    return subprocess.run([sys.executable, "-m", "msprobe.cli.main", *args], capture_output=True, text=True)


def test_cli_writes_csv_json_and_plots(runs, tmp_path):
    out = tmp_path / "cmp"
    res = _msprobe("grad_compare", runs["base"], runs["batch3"], "-o", str(out), "--no-progress")
    assert res.returncode == 0, res.stderr
    assert "runs diverge at step 3" in res.stdout
    doc = json.load(open(out / "grad_compare.json"))
    assert doc["first_divergent_step"] == 3 and doc["ranks"][0]["first_different_step"] == 3
    with open(out / "rank0" / "similarities.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(STEPS))
    assert float(rows[2]["total"]) == 1.0 and float(rows[3]["total"]) < 0.97
    pics = sorted(os.listdir(out / "rank0" / "similarities_picture"))
    assert pics == ["fc1.bias.png", "fc1.weight.png", "fc2.bias.png", "fc2.weight.png", "summary_similarities.png"]
    for p in pics:
        with open(out / "rank0" / "similarities_picture" / p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    res = _msprobe("grad_compare", "-i", runs["base"], runs["again"], "-o", str(tmp_path / "same"),
                   "--no-plots", "--no-progress")
    assert res.returncode == 0 and "no divergence" in res.stdout and "identical at every step" in res.stdout
    assert json.load(open(tmp_path / "same" / "grad_compare.json"))["first_divergent_step"] is None


def test_bad_input_is_one_line(runs, tmp_path):
    (tmp_path / "empty").mkdir()
    for args, fragment in ((["grad_compare", runs["base"]], "expected two runs"),
                           (["grad_compare", runs["base"], str(tmp_path / "empty")], "no grad_probe output"),
                           (["grad_compare", runs["base"], runs["again"], "--threshold", "2"], "--threshold")):
        res = _msprobe(*args, "-o", str(tmp_path / "o"))
        assert res.returncode == 1 and fragment in res.stderr, res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
    with pytest.raises(DumpFormatError):
        compare_grad_runs(runs["base"], str(tmp_path / "empty"))
    for kw in ({"threshold": 2.0}, {"drop": -0.1}):  # the command's range checks are the Python API's
        with pytest.raises(MsprobeError, match=r"^--(threshold|drop): got .*; allowed: a number in \[0, 1\]$"):
            compare_grad_runs(runs["base"], runs["again"], **kw)
    other = tmp_path / "other" / "rank0"
    other.mkdir(parents=True)
    (other / "grad_summary_0.csv").write_text("Param_name,Max,Min,Norm,Shape\nw,1,0,1,\"[3]\"\n")
    with pytest.raises(MsprobeError, match="share no parameter"):
        compare_grad_runs(runs["base"], str(tmp_path / "other"))
    (other / "grad_summary_0.csv").write_text("name,Max\nw,1\n")
    with pytest.raises(DumpFormatError, match="Param_name"):
        compare_grad_runs(runs["base"], str(tmp_path / "other"))

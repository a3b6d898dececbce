"""What a user reads after a command: the full path of every file it wrote (with a relative `-o`, from
another directory), at msProbe's default places, and acc_check's time being the time the user waited."""

import os
import re
import subprocess
import sys
import time

import pytest

from private_modules import load_private

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def msprobe(cwd, *args):
    proc = subprocess.run([sys.executable, "-m", "msprobe.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def assert_every_file_named(out_dir, stdout):
    """Each file under `out_dir` is printed with its absolute path, or its folder is (a folder of plots)."""
    files = [os.path.join(d, f) for d, _, names in os.walk(out_dir) for f in names]
    assert files
    for f in files:
        assert f in stdout or os.path.dirname(f) + os.sep in stdout, (f, stdout)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Dumps made in a working directory: the example transformer at mix (fp32 and a bf16 softmax), an
    overflowing exp, and two gradient-monitor runs."""
    root = tmp_path_factory.mktemp("cwd")
    train = load_private("msprobe_example_train", os.path.join(ROOT, "examples", "train.py"))
    train.train("pytorch", "transformer", 1, dump=str(root / "run_fp32"))
    train.train("pytorch", "transformer", 1, dump=str(root / "run_bf16"), plant=("bf16-softmax", None))
    from msprobe.pytorch import PrecisionDebugger
    dbg = PrecisionDebugger(dump_path=str(root / "overflow"), level="L1", task="statistics")
    dbg.start()
    torch.exp(torch.full((4,), 1000.0))
    dbg.stop()
    dbg.step()
    dbg.close()
    from msprobe.core.grad_probe.config import grad_probe_config_from_dict
    from msprobe.pytorch.grad_probe import GradientMonitor
    for run, lr in (("grads_a", 0.1), ("grads_b", 0.5)):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        mon = GradientMonitor(config=grad_probe_config_from_dict({"task": "grad_probe", "dump_path": str(root / run)}))
        mon.monitor(model)
        for _ in range(3):
            model(torch.ones(8, 4)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
        mon.close()
    return root


def dump_json(root, run):
    return str(next((root / run / "step0").glob("proc*/dump.json")).relative_to(root))


def test_every_written_file_is_printed_with_its_full_path(work):
    out = msprobe(work, "acc_check", "-api_info", dump_json(work, "run_fp32"), "-o", "acc", "--no_progress")
    assert_every_file_named(str(work / "acc"), out)
    out = msprobe(work, "graph_visualize", "-tp", "run_bf16", "-gp", "run_fp32", "-o", "graph", "--no-progress")
    assert_every_file_named(str(work / "graph"), out)
    out = msprobe(work, "overflow_check", "-i", "overflow", "--no-progress")      # msProbe's default ./output
    assert_every_file_named(str(work / "output"), out)
    out = msprobe(work, "grad_compare", "grads_a", "grads_b", "-o", "grads", "--no-progress")
    assert_every_file_named(str(work / "grads"), out)


@pytest.mark.parametrize("command", [("grad_compare", "../grads_a", "../grads_b"), ("overflow_check", "-i", "../overflow")])
def test_every_command_writes_to_one_default_output_folder(work, command):
    """Without -o every command writes under ./output (msProbe's compare default), as its help says;
    acc_check keeps msProbe's working directory (tests/acc_check: the seed's quick start as written)."""
    cwd = work / f"default_{command[0]}"
    cwd.mkdir()
    out = msprobe(cwd, *command, "--no-progress")
    assert os.listdir(cwd) == ["output"]
    assert_every_file_named(str(cwd / "output"), out)
    assert "(default ./output)" in msprobe(cwd, command[0], "-h")
    assert "(default ./)" in msprobe(cwd, "acc_check", "-h")


def test_acc_check_reports_the_time_the_user_waited(work):
    started = time.perf_counter()
    out = msprobe(work, "acc_check", "-api_info", dump_json(work, "run_bf16"), "-o", "acc2", "--no_progress")
    waited = time.perf_counter() - started
    reported = float(re.search(r"APIs checked on \S+ in ([\d.]+) s", out).group(1))
    # the command's own time, reading the dump and importing torch included (the checking loop alone is
    # a tenth of it); not the interpreter's start and exit
    assert 0.5 * waited <= reported <= waited, (reported, waited, out)

"""A run killed with SIGKILL and resumed with -csv_path ends with exactly the rows of an uninterrupted
run (none twice, none lost, same numbers); multi_acc_check with two worker processes gives the same
rows too, and resumes the same way."""

import csv
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from msprobe.core.acc_check.runner import default_start_method, run_acc_check, run_multi_acc_check
from msprobe.pytorch import PrecisionDebugger

HERE = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))


def read(path):
    with open(path, encoding="utf-8-sig", newline="") as f:
        return [tuple(r) for r in csv.reader(f)]


def cli(*args):
    return [sys.executable, "-m", "msprobe.cli.main", *args, "--custom_api", "SlowOps=lowprec_ops", "--no_progress"]


@pytest.fixture(scope="module")
def slow_dump(tmp_path_factory):
    """13 APIs, 4 of them a custom add that sleeps: a run lasts long enough to be killed mid-way."""
    sys.path.insert(0, HERE)
    import lowprec_ops
    sys.path.remove(HERE)
    tmp = tmp_path_factory.mktemp("slow")
    dbg = PrecisionDebugger(dump_path=str(tmp / "dump"), level="L1", task="statistics")
    dbg.register_custom_api(lowprec_ops, "slow_add", "SlowOps")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 32, generator=g, requires_grad=True)
    w = torch.randn(32, 32, generator=g, requires_grad=True)
    dbg.start()
    h = x
    for _ in range(4):
        h = lowprec_ops.slow_add(torch.nn.functional.linear(h, w), h)
        h = torch.tanh(h)
    h.sum().backward()
    dbg.stop()
    dbg.step()
    dbg.close()
    from acc_fixtures import dump_json_of
    return dump_json_of(tmp / "dump")


@pytest.fixture(scope="module")
def reference(slow_dump, tmp_path_factory):
    """The rows of an uninterrupted run (in this process: the same code the command runs)."""
    out = tmp_path_factory.mktemp("ref")
    sys.path.insert(0, HERE)
    try:
        report = run_acc_check(slow_dump, out_path=str(out), custom_apis=("SlowOps=lowprec_ops",), progress=False)
    finally:
        sys.path.remove(HERE)
    result, details = read(report.result_csv), read(report.details_csv)
    assert len(result) == 1 + 13 and len(details) > len(result)
    return result, details


def kill_after(cmd, result_glob_dir, rows_wanted):
    """Start `cmd`, SIGKILL it once its result CSV has `rows_wanted` data rows; return that count."""
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    seen = 0
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            for path in result_glob_dir.rglob("accuracy_checking_result_*.csv"):
                with open(path, "rb") as f:
                    seen = max(seen, f.read().count(b"\n") - 1)
            if seen >= rows_wanted:
                break
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return seen


def test_sigkill_then_resume_gives_the_uninterrupted_rows(slow_dump, reference, tmp_path):
    out = tmp_path / "out"
    seen = kill_after(cli("acc_check", "-api_info", slow_dump, "-o", str(out)), tmp_path, 4)
    result_csv = next(out.glob("accuracy_checking_result_*.csv"))
    details_csv = next(out.glob("accuracy_checking_details_*.csv"))
    partial = read(result_csv)
    assert 4 <= seen and len(partial) - 1 < len(reference[0]) - 1, "the run was not interrupted mid-way"
    # make the kill as bad as it gets: a torn last line, and details of an API with no result row
    with open(details_csv, "a", encoding="utf-8") as f:
        f.write("Torch.tanh.3.forward.output.0,torch.float64,torch.float32,\"(8, 32)\",1.0,0.0,0.0,pass,,0.0,1,pass\n")
    with open(result_csv, "a", encoding="utf-8") as f:
        f.write("Torch.tanh.3,pa")
    proc = subprocess.run(cli("acc_check", "-api_info", slow_dump, "-csv_path", str(result_csv)), env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "already done" in proc.stdout
    assert list(out.glob("accuracy_checking_result_*.csv")) == [result_csv]  # appended, no new file
    assert read(result_csv) == reference[0]
    assert read(details_csv) == reference[1]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_two_workers_give_the_same_rows(slow_dump, reference, tmp_path, start_method):
    """fork is what the command uses for PyTorch on a CPU machine; spawn is the safe default."""
    sys.path.insert(0, HERE)  # spawned workers get this process's sys.path
    try:
        report = run_multi_acc_check(slow_dump, devices=[0, 1], out_path=str(tmp_path), progress=False,
                                     custom_apis=("SlowOps=lowprec_ops",), start_method=start_method)
    finally:
        sys.path.remove(HERE)
    assert report.workers == 2 and len(report.results) == len(reference[0]) - 1
    assert len(report.worker_cpu_s) == 2 and all(c > 0 for c in report.worker_cpu_s)
    assert read(next(tmp_path.glob("accuracy_checking_result_*.csv"))) == reference[0]
    assert read(next(tmp_path.glob("accuracy_checking_details_*.csv"))) == reference[1]
    assert not list(tmp_path.glob("accuracy_checking_parts_*"))  # parts merged and removed


def test_two_workers_move_the_progress_bar_to_the_end(slow_dump, tmp_path, capsys):
    """Workers count finished APIs in shared memory; the parent's bar must still reach every API."""
    sys.path.insert(0, HERE)
    try:
        report = run_multi_acc_check(slow_dump, devices=[0, 1], out_path=str(tmp_path), progress=True,
                                     custom_apis=("SlowOps=lowprec_ops",))  # its own start method: fork here
    finally:
        sys.path.remove(HERE)
    assert "13/13" in capsys.readouterr().err
    assert report.workers == 2


def test_the_start_method_is_chosen_by_the_runner():
    """A Python caller gets what the command line gets: fork only where no framework thread or device
    context can be inherited."""
    assert default_start_method("pytorch", 0) == ("fork" if sys.platform.startswith("linux") else "spawn")
    assert default_start_method("pytorch", 2) == "spawn"
    assert default_start_method("mindspore", 0) == "spawn"
    assert default_start_method("mindtorch", 0) == "spawn"


def test_killed_multi_run_resumes(slow_dump, reference, tmp_path):
    kill_after(cli("multi_acc_check", "-api_info", slow_dump, "-d", "0", "1", "-o", str(tmp_path)), tmp_path, 3)
    result_csv = next(tmp_path.glob("accuracy_checking_result_*.csv"))
    assert list(tmp_path.glob("accuracy_checking_parts_*"))  # the workers' parts survived the kill
    proc = subprocess.run(cli("multi_acc_check", "-api_info", slow_dump, "-d", "0", "1",
                              "-csv_path", str(result_csv)), env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert read(result_csv) == reference[0]
    assert read(result_csv.with_name(result_csv.name.replace("result", "details"))) == reference[1]


def test_blas_runs_on_one_thread_while_checking(slow_dump, tmp_path):
    """An idle OpenBLAS thread spins a whole core: a second worker would have none to run on."""
    from threadpoolctl import threadpool_info

    from msprobe.core.acc_check.csv_files import ResultFiles
    from msprobe.core.acc_check.execution import ExecutorSpec
    from msprobe.core.acc_check.runner import check_cases, load_dump

    sys.path.insert(0, HERE)
    try:
        reader, cases = load_dump(slow_dump)
        spec = ExecutorSpec("pytorch", (("custom_apis", ("SlowOps=lowprec_ops",)),))
        seen = []

        def blas_threads(_name):
            seen.append({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})
        with ResultFiles(str(tmp_path), "t") as files:
            results = list(check_cases(cases, reader, spec, files, progress=blas_threads))
    finally:
        sys.path.remove(HERE)
    assert len(results) == len(cases) == len(seen)
    assert all(threads == {1} for threads in seen), seen

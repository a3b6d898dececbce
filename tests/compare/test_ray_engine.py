"""`msprobe compare --engine ray` on a real two-node Ray cluster on loopback (a head and a second node,
one CPU each, started with `ray start` here), comparing the multi-rank dumps of real gloo training
runs: the same files (csv, xlsx) and diagnosis.json as the process pool, byte for byte; a worker
SIGKILLed mid-pair and a driver SIGKILLed mid-compare (then --resume) still give that result; a corrupt
rank dump is reported in one line, the other pairs are compared and the exit code is 1; the rows are
queryable as Parquet.

One cluster for the module, and this process attaches to it once (`driver`): the in-process compares
share its job and so its warm workers; the CLI runs are drivers of their own, as a user's are."""

import filecmp
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

pytest.importorskip("torch")
ray = pytest.importorskip("ray")
pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")

from gloo_ranks import free_port, run_ranks  # noqa: E402
from msprobe.core.compare import write_compare  # noqa: E402
from msprobe.core.compare.engines.ray import TASK_NAME  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD, STEPS = 2, 2
TS = "20260101000000"

WORKER = textwrap.dedent('''
    import datetime, os, sys
    import torch.distributed as dist
    sys.path.insert(0, sys.argv[2])
    import planted

    root = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    for task in ("statistics", "tensor", "md5"):
        os.makedirs(f"{root}/{task}", exist_ok=True)
        for turn in range(dist.get_world_size()):  # md5 goes through one config.json beside the dump: in turn
            if turn == rank:
                planted.dump_run(f"{root}/{task}/golden", None, task=task, rank=rank, steps=%d)
                planted.dump_run(f"{root}/{task}/target", "bf16_softmax" if rank == 1 else None, task=task,
                                 rank=rank, steps=%d)
            dist.barrier()
    dist.destroy_process_group()
''' % (STEPS, STEPS))


def _ray_cli():
    exe = os.path.join(os.path.dirname(sys.executable), "ray")
    return [exe] if os.path.isfile(exe) else [sys.executable, "-m", "ray.scripts.scripts"]


@pytest.fixture(scope="module")
def ray_nodes():
    """A head node and a second node on 127.0.0.1, one CPU each, coming up (the dumps are made
    meanwhile): (address, their `ray start` processes). Ended, only these, at teardown."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    common = ["--num-cpus=1", "--object-store-memory=100000000", "--block", "--disable-usage-stats"]
    # a loopback cluster of this test alone: no auth token (drivers attaching to it do not send one)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    address = f"127.0.0.1:{port}"
    nodes = []
    try:
        for role in ([f"--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={temp}"],
                     [f"--address={address}"]):  # the second node waits for the head by itself
            nodes.append(subprocess.Popen([*_ray_cli(), "start", *role, "--node-ip-address=127.0.0.1", *common],
                                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))
        yield address, nodes
    finally:
        for p in nodes:  # `ray start --block` ends its node's processes on SIGTERM; what is left, SIGKILL
            _signal_group(p.pid, signal.SIGTERM)
        end = time.monotonic() + 5  # a node's clean stop waits on its workers: the temp dir goes anyway
        for p in nodes:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p.pid, signal.SIGKILL)
            p.wait()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(ray_nodes, gloo_dumps, pool_results):
    """The address of the two-node cluster, once both nodes are up."""
    address, nodes = ray_nodes
    _wait_for(lambda: _cluster_cpus(address) >= 2, 120, nodes)
    return address


@pytest.fixture(scope="module")
def driver(cluster):
    """This process attached to the cluster, once: write_compare(engine="ray") uses a Ray already
    initialized (and leaves it be), so the module's in-process compares share one job's workers."""
    ray.init(address=cluster, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield cluster
    finally:
        ray.shutdown()


def _signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _cluster_cpus(address):
    code = (f"import ray; ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False); "
            "print(int(ray.cluster_resources().get('CPU', 0)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0


def _wait_for(ready, seconds, nodes):
    end = time.monotonic() + seconds
    while not ready():
        assert all(p.poll() is None for p in nodes), "a `ray start` exited"
        assert time.monotonic() < end, "the Ray cluster did not come up"
        time.sleep(1)


@pytest.fixture(scope="module")
def gloo_dumps(tmp_path_factory):
    """root/{statistics,tensor,md5}/{golden,target}: two gloo ranks, three steps; rank 1's target
    computes its softmax in bfloat16."""
    root = tmp_path_factory.mktemp("gloo_dumps")
    script = root / "worker.py"
    script.write_text(WORKER)
    run_ranks(script, WORLD, [root, HERE])
    return root


@pytest.fixture(scope="module")
def pool_results(gloo_dumps, tmp_path_factory):
    """task -> output folder of the process pool's compare (the reference)."""
    out = {}
    for task in ("statistics", "tensor", "md5"):
        folder = tmp_path_factory.mktemp(f"pool_{task}")
        write_compare(str(gloo_dumps / task / "target"), str(gloo_dumps / task / "golden"), str(folder),
                      progress=False, keep_tables=False, timestamp=TS)
        out[task] = folder
    return out


def _result_files(folder):
    """name without its timestamp -> path, of the per-pair result files."""
    return {re.sub(r"_\d{14}(?=\.(csv|xlsx)$)", "", os.path.basename(p)): p
            for p in glob.glob(os.path.join(str(folder), "*.csv")) + glob.glob(os.path.join(str(folder), "*.xlsx"))}


def _same_file(a, b):
    return filecmp.cmp(a, b, shallow=False)


def assert_same_files(expected, got, pairs=WORLD * STEPS):
    want, have = _result_files(expected), _result_files(got)
    assert sorted(want) == sorted(have) and len(want) == pairs, (sorted(want), sorted(have))
    for name in want:
        assert _same_file(want[name], have[name]), name
    assert filecmp.cmp(os.path.join(expected, "diagnosis.json"), os.path.join(got, "diagnosis.json"),
                       shallow=False)


def test_ray_writes_what_the_pool_writes(driver, gloo_dumps, pool_results, tmp_path):
    for task in ("statistics", "tensor", "md5"):
        out = write_compare(str(gloo_dumps / task / "target"), str(gloo_dumps / task / "golden"),
                            str(tmp_path / task), progress=False, keep_tables=False, timestamp=TS,
                            engine="ray", address=driver)
        assert_same_files(pool_results[task], tmp_path / task)
        if task != "md5":  # checksums say which rows differ, not by how much
            assert out.diagnosis["suspects"][0]["ranks"] == [1]  # the planted rank, found over all pairs
        assert len(glob.glob(str(tmp_path / task / "rows" / "step=*" / "rank=*" / "part.parquet"))) == WORLD * STEPS
    rows = pd.read_parquet(str(tmp_path / "statistics" / "rows"))  # every pair's rows, one query
    worst = rows[rows["Result"] != "pass"].sort_values("NormRelativeErr", ascending=False)
    assert sorted(rows["rank"].astype(int).unique()) == [0, 1] and len(rows) == sum(
        len(pd.read_csv(p)) for p in _result_files(tmp_path / "statistics").values())
    assert int(worst.iloc[0]["rank"]) == 1


def test_ray_writes_the_same_xlsx(driver, gloo_dumps, tmp_path):
    """Byte for byte, its zip entries' times and document properties included (the compare's timestamp)."""
    args = (str(gloo_dumps / "statistics" / "target"), str(gloo_dumps / "statistics" / "golden"))
    write_compare(*args, str(tmp_path / "pool"), progress=False, keep_tables=False, timestamp=TS, xlsx=True)
    time.sleep(2.1)  # a clock-stamped zip entry or property would now differ
    write_compare(*args, str(tmp_path / "ray"), progress=False, keep_tables=False, timestamp=TS, xlsx=True,
                  engine="ray", address=driver)
    assert_same_files(tmp_path / "pool", tmp_path / "ray")
    assert all(p.endswith(".xlsx") for p in _result_files(tmp_path / "ray").values())


def _ancestors(pid):
    seen = []
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
        seen.append(pid)
    return seen


def _pair_workers(node_pids):
    """Pids of this cluster's worker processes running a compare pair now."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if cmd.startswith(f"ray::{TASK_NAME}") and set(_ancestors(int(entry))) & node_pids:
            found.append(int(entry))
    return found


def test_a_worker_killed_mid_pair_is_retried(ray_nodes, driver, gloo_dumps, pool_results, tmp_path):
    nodes, killed, stop = {p.pid for p in ray_nodes[1]}, [], threading.Event()  # the `ray start` processes

    def killer():  # SIGKILL the first worker seen comparing a pair
        while not stop.is_set() and not killed:
            for pid in _pair_workers(nodes):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                break
            time.sleep(0.005)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        out = write_compare(str(gloo_dumps / "tensor" / "target"), str(gloo_dumps / "tensor" / "golden"),
                            str(tmp_path), progress=False, keep_tables=False, timestamp=TS, engine="ray",
                            address=driver)
    finally:
        stop.set()
        thread.join()
    assert killed, "no worker was seen running a pair"
    assert not out.failed_pairs
    assert_same_files(pool_results["tensor"], tmp_path)


def _cli(*args):
    return [sys.executable, "-m", "msprobe.cli.main", "compare", *map(str, args)]


def test_a_driver_killed_and_resumed_gives_the_same_result(cluster, gloo_dumps, pool_results, tmp_path):
    task = gloo_dumps / "tensor"
    cmd = _cli("-tp", task / "target", "-gp", task / "golden", "-o", tmp_path, "--engine", "ray",
               "--address", cluster, "--no-progress")
    parts = str(tmp_path / "rows" / "step=*" / "rank=*" / "part.parquet")
    driver = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    end = time.monotonic() + 120
    while not glob.glob(parts):
        assert driver.poll() is None, driver.stderr.read().decode()
        assert time.monotonic() < end
        time.sleep(0.01)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    driver.stderr.close()
    before = {p: os.stat(p).st_ino for p in glob.glob(parts)}
    assert 0 < len(before) < WORLD * STEPS, "the driver was not killed halfway"
    assert not os.path.exists(tmp_path / "diagnosis.json")
    resumed = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert all(os.stat(p).st_ino == ino for p, ino in before.items()), "a completed pair was compared again"
    assert_same_files(pool_results["tensor"], tmp_path)


def test_a_corrupt_rank_dump_is_reported_and_the_rest_compared(cluster, gloo_dumps, pool_results, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(gloo_dumps / "statistics" / "target", target)
    with open(target / "step1" / "rank1" / "dump.json", "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 2)
    run = subprocess.run(_cli("-tp", target, "-gp", gloo_dumps / "statistics" / "golden", "-o", tmp_path / "out",
                              "--engine", "ray", "--address", cluster, "--no-progress"),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    lines = [ln for ln in run.stderr.splitlines() if "step 1 rank 1" in ln]
    assert len(lines) == 1 and "skipped" in lines[0] and "dump.json" in lines[0], run.stderr
    assert "Traceback" not in run.stderr
    diagnosis = json.loads((tmp_path / "out" / "diagnosis.json").read_text())
    assert [(f["step"], f["rank"]) for f in diagnosis["failed_pairs"]] == [(1, 1)]
    want, have = _result_files(pool_results["statistics"]), _result_files(tmp_path / "out")
    assert sorted(have) == sorted(n for n in want if "step1_rank1" not in n)
    for name in have:
        assert _same_file(want[name], have[name]), name


def test_without_ray_installed_the_engine_says_what_to_install(gloo_dumps, tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"  # as when Ray is not installed: `import ray` fails
            "from msprobe.cli.main import main\n"
            f"sys.exit(main(['compare', '-tp', {str(gloo_dumps / 'md5' / 'target')!r}, "
            f"'-gp', {str(gloo_dumps / 'md5' / 'golden')!r}, '-o', {str(tmp_path)!r}, '--engine', 'ray']))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and 'pip install "msprobe[ray]"' in lines[0], run.stderr

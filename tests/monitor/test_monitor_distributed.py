"""TrainerMon under DistributedDataParallel: two real processes on gloo, each with its own data.

Each rank also runs a plain (non-DDP) copy of the model on its batch to get its local gradients, so
the test knows both sides of the reduction: grad_unreduced must be the rank's local gradient,
grad_reduced the DDP average (the same on both ranks; its mean is the mean of the two local means).
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from msprobe.core.monitor.reader import find_rank_dirs, load_monitor_dir  # noqa: E402

if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

WORKER = textwrap.dedent('''
    import copy, datetime, json, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from msprobe.pytorch import TrainerMon

    config = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    mon = TrainerMon(config)
    mon.set_monitor(model, grad_acc_steps=1, optimizer=opt)
    torch.manual_seed(100 + rank)                     # different data per rank
    local, reduced = [], []
    for step in range(2):
        x, y = torch.randn(6, 5) * (rank + 1), torch.randn(6, 2)
        plain = copy.deepcopy(net)                    # same weights, no DDP: this rank's local gradient
        nn.functional.mse_loss(plain(x), y).backward()
        local.append({"module." + n: [p.grad.norm().item(), p.grad.mean().item()] for n, p in plain.named_parameters()})
        nn.functional.mse_loss(model(x), y).backward()
        reduced.append({n: [p.grad.norm().item(), p.grad.mean().item()] for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    mon.close()
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": rank, "dir": mon.output_dir, "local": local, "reduced": reduced}), flush=True)
''')


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp_monitor")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    config = tmp / "monitor.json"
    config.write_text(json.dumps({"wg_distribution": True, "xy_distribution": True, "forward_only": True,
                                  "ops": ["norm", "mean"], "format": "csv"}))
    out = tmp / "monitor_output"
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", MONITOR_OUTPUT_DIR=str(out))
        procs.append(subprocess.Popen([sys.executable, str(script), str(config)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = {}
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=180)
            assert p.returncode == 0, f"rank failed ({p.returncode}):\n{stdout}\n{stderr}"
            res = json.loads([ln for ln in stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT "):])
            results[res["rank"]] = res
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out, results


def test_one_rank_dir_per_rank(ddp_run):
    out, results = ddp_run
    dirs = find_rank_dirs(str(out))
    assert [r for r, _ in dirs] == [0, 1]
    for rank, d in dirs:
        assert os.path.abspath(d) == os.path.abspath(results[rank]["dir"])
        files = sorted(os.listdir(d))
        assert files == ["actv_0-0.csv", "actv_1-1.csv", "grad_reduced_0-0.csv", "grad_reduced_1-1.csv",
                         "grad_unreduced_0-0.csv", "grad_unreduced_1-1.csv"]


def test_unreduced_is_the_local_gradient_and_reduced_the_average(ddp_run):
    out, results = ddp_run
    df = load_monitor_dir(str(out))
    for step in range(2):
        for name in results[0]["local"][step]:
            got = {}
            for rank in (0, 1):
                sel = df[(df["rank"] == rank) & (df["step"] == step) & (df["name"] == name)]
                got[rank] = {tag: sel[sel["tag"] == tag].iloc[0] for tag in ("grad_unreduced", "grad_reduced")}
                local_norm, local_mean = results[rank]["local"][step][name]
                assert got[rank]["grad_unreduced"]["norm"] == pytest.approx(local_norm, rel=1e-4), (rank, name)
                red_norm, _ = results[rank]["reduced"][step][name]
                assert got[rank]["grad_reduced"]["norm"] == pytest.approx(red_norm, rel=1e-4), (rank, name)
            # the two ranks saw different data, so their local gradients differ ...
            assert got[0]["grad_unreduced"]["norm"] != pytest.approx(got[1]["grad_unreduced"]["norm"], rel=1e-3)
            # ... and after reduction they hold the same average
            assert got[0]["grad_reduced"]["norm"] == pytest.approx(got[1]["grad_reduced"]["norm"], rel=1e-5)
            mean_of_means = (results[0]["local"][step][name][1] + results[1]["local"][step][name][1]) / 2
            assert got[0]["grad_reduced"]["mean"] == pytest.approx(mean_of_means, rel=1e-3, abs=1e-6)


def test_activations_per_rank(ddp_run):
    out, _ = ddp_run
    df = load_monitor_dir(str(out))
    actv = df[(df["tag"] == "actv") & (df["name"] == "module.0.input")]
    by_rank = dict(zip(actv[actv["step"] == 0]["rank"], actv[actv["step"] == 0]["norm"]))
    assert set(by_rank) == {0, 1} and by_rank[1] > by_rank[0]       # rank 1's inputs are scaled by 2

"""Multi-rank dumps: two real processes on the gloo backend (MASTER_ADDR=127.0.0.1, a free port).

Each rank trains a small DDP-wrapped model under PrecisionDebugger(level="L1"), then calls
dist.all_reduce and dist.broadcast on its own tensors. Expected layout: dump_path/step0/rank{R}/ with
one dump.json per rank, no proc* dirs, and each rank writing only below its own rank dir.
"""

import json
import math
import os
import socket
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import msprobe_test_models as models  # noqa: E402  (loaded by conftest.py)

WORKER = textwrap.dedent('''
    import datetime, json, os, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from msprobe.pytorch import PrecisionDebugger

    dump_path, config, use_ddp = sys.argv[1], sys.argv[2] or None, sys.argv[3] == "ddp"
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    if use_ddp:
        model = nn.parallel.DistributedDataParallel(model)
    debugger = PrecisionDebugger(config_path=config, dump_path=dump_path, level="L1")

    debugger.start()
    x = torch.randn(3, 4) + rank
    model(x).sum().backward()
    t = torch.arange(4, dtype=torch.float32) + 10 * rank   # rank0: 0 1 2 3, rank1: 10 11 12 13
    dist.all_reduce(t)
    b = torch.full((3,), float(rank + 1))                   # rank0: 1 1 1, rank1: 2 2 2
    dist.broadcast(b, src=0)
    debugger.stop()
    debugger.step()

    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": rank, "pid": os.getpid(), "all_reduce": t.tolist(),
                                  "broadcast": b.tolist()}), flush=True)
''')

# DDP with gradient accumulation: the first micro-batch under no_sync (its gradients stay local in .grad),
# the second all-reduced; the dump of one step at mix
ACCUMULATING_WORKER = textwrap.dedent('''
    import datetime, json, sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from msprobe.pytorch import PrecisionDebugger

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(dump_path=sys.argv[1], level=sys.argv[2])
    debugger.start(model)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(rank)) + rank
    with model.no_sync():
        model(x * 2).sum().backward()
    model(x).sum().backward()
    opt.step()
    debugger.stop()
    debugger.step()
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": rank}), flush=True)
''')


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (all held open while picking, so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def launch(script, dump_path, port, config="", ddp=True):
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), str(dump_path), config,
                                       "ddp" if ddp else "plain"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def collect(procs, timeout=120):
    """Wait for every rank (killing all of them on timeout), then check each one's exit and result."""
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            outputs.append(p.communicate())
    results = {}
    for p, (stdout, stderr) in zip(procs, outputs):
        assert p.returncode == 0, f"rank process failed ({p.returncode}):\n{stdout}\n{stderr}"
        line = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")][-1]
        res = json.loads(line[len("RESULT "):])
        results[res["rank"]] = res
    return results


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Two 2-rank jobs, started together: DDP with the default config, and a plain model with rank [1]."""
    tmp = tmp_path_factory.mktemp("dist")
    script = tmp / "worker.py"
    script.write_text(WORKER)
    config = tmp / "config.json"
    config.write_text(json.dumps({"task": "statistics", "rank": [1], "level": "L1"}))
    port_all, port_rank1 = free_ports(2)
    both = launch(script, tmp / "dump_all", port_all)
    only1 = launch(script, tmp / "dump_rank1", port_rank1, config=str(config), ddp=False)
    try:
        return {"all": (tmp / "dump_all", collect(both)), "rank1": (tmp / "dump_rank1", collect(only1))}
    finally:
        for p in both + only1:
            if p.poll() is None:
                p.kill()
                p.wait()


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def all_files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def stats(values):
    return {"Max": max(values), "Min": min(values), "Mean": sum(values) / len(values),
            "Norm": math.sqrt(sum(v * v for v in values))}


def assert_stats(rec, values):
    assert rec["type"] == "torch.Tensor" and rec["dtype"] == "torch.float32" and rec["shape"] == [len(values)]
    for name, want in stats(values).items():
        assert rec[name] == pytest.approx(want, rel=1e-6), (name, rec, values)


def rank_data(root, rank):
    return load(os.path.join(root, "step0", f"rank{rank}", "dump.json"))["data"]


# -- layout ------------------------------------------------------------------------------------------
def test_collectives_ran(jobs):
    _, res = jobs["all"]
    assert sorted(res) == [0, 1]
    for r in res.values():
        assert r["all_reduce"] == [10.0, 12.0, 14.0, 16.0]
        assert r["broadcast"] == [1.0, 1.0, 1.0]


def test_one_rank_dir_per_rank_no_proc_dirs(jobs):
    root, _ = jobs["all"]
    assert os.listdir(root) == ["step0"]
    assert sorted(os.listdir(root / "step0")) == ["rank0", "rank1"]
    for rank in (0, 1):
        rank_dir = root / "step0" / f"rank{rank}"
        assert sorted(os.listdir(rank_dir)) == ["construct.json", "dump.json", "stack.json"]
        doc = load(rank_dir / "dump.json")
        assert doc["task"] == "statistics" and doc["level"] == "L1" and doc["framework"] == "pytorch"
        load(rank_dir / "stack.json")
        assert load(rank_dir / "construct.json") == {}  # L1
    assert not any(part.startswith("proc") for f in all_files(root) for part in f.split(os.sep))


def test_no_file_written_by_both_ranks(jobs):
    """Every file lies below exactly one rank dir, and each rank's dump.json holds that rank's own data."""
    root, _ = jobs["all"]
    files = all_files(root)
    owners = {}
    for f in files:
        parts = f.split(os.sep)
        assert parts[0] == "step0" and parts[1] in ("rank0", "rank1") and len(parts) >= 3, f
        owners.setdefault(os.sep.join(parts[2:]), set()).add(parts[1])
    assert owners == {"dump.json": {"rank0", "rank1"}, "stack.json": {"rank0", "rank1"},
                      "construct.json": {"rank0", "rank1"}}  # one copy each, none shared
    d0, d1 = rank_data(root, 0), rank_data(root, 1)
    assert d0["Distributed.all_reduce.0.forward"]["input_args"][0]["Max"] == 3.0
    assert d1["Distributed.all_reduce.0.forward"]["input_args"][0]["Max"] == 13.0


def test_model_apis_recorded_on_both_ranks(jobs):
    root, _ = jobs["all"]
    for rank in (0, 1):
        data = rank_data(root, rank)
        for key in ("Functional.linear.0.forward", "Functional.relu.0.forward", "Functional.linear.1.forward",
                    "Functional.linear.0.backward", "Distributed.broadcast.0.forward"):
            assert key in data, (rank, key)
    # the model inputs differ per rank (x + rank), so their statistics do
    d0, d1 = rank_data(root, 0), rank_data(root, 1)
    assert d0["Functional.linear.0.forward"]["input_args"][0]["Mean"] != \
        d1["Functional.linear.0.forward"]["input_args"][0]["Mean"]


# -- collectives -------------------------------------------------------------------------------------
def test_all_reduce_input_is_before(jobs):
    root, _ = jobs["all"]
    for rank in (0, 1):
        rec = rank_data(root, rank)["Distributed.all_reduce.0.forward"]
        assert len(rec["input_args"]) == 1 and rec["input_kwargs"] == {}
        assert_stats(rec["input_args"][0], [10.0 * rank + i for i in range(4)])


def test_all_reduce_output_is_sum_over_ranks(jobs):
    root, _ = jobs["all"]
    for rank in (0, 1):
        rec = rank_data(root, rank)["Distributed.all_reduce.0.forward"]
        assert len(rec["output"]) == 1
        assert_stats(rec["output"][0], [10.0, 12.0, 14.0, 16.0])


def test_broadcast_before_and_after(jobs):
    root, _ = jobs["all"]
    for rank in (0, 1):
        rec = rank_data(root, rank)["Distributed.broadcast.0.forward"]
        assert rec["input_kwargs"] == {"src": {"type": "int", "value": 0}}
        assert_stats(rec["input_args"][0], [float(rank + 1)] * 3)
        assert_stats(rec["output"][0], [1.0] * 3)  # rank 0's values everywhere


# -- rank selection ------------------------------------------------------------------------------------
def test_config_rank_list_dumps_only_that_rank(jobs):
    root, res = jobs["rank1"]
    assert sorted(res) == [0, 1]  # both ranks ran to the end
    assert all_files(root) == [os.path.join("step0", "rank1", f)
                               for f in ("construct.json", "dump.json", "stack.json")]
    data = rank_data(root, 1)
    assert "Distributed.all_reduce.0.forward" in data and "Functional.linear.0.forward" in data
    assert_stats(data["Distributed.all_reduce.0.forward"]["input_args"][0], [10.0, 11.0, 12.0, 13.0])


def test_start_rank_id_names_the_rank_dir(tmp_path):
    """start(rank_id=7) names the folder rank7 instead of proc{pid} (or of the process group's rank)."""
    from msprobe.pytorch import PrecisionDebugger
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1")
    try:
        debugger.start(rank_id=7)
        torch.relu(torch.arange(4.0) - 1)
        debugger.stop()
        debugger.step()
    finally:
        debugger.close()
    assert os.listdir(tmp_path / "dump") == ["step0"]
    assert os.listdir(tmp_path / "dump" / "step0") == ["rank7"]
    data = load(tmp_path / "dump" / "step0" / "rank7" / "dump.json")["data"]
    assert "Torch.relu.0.forward" in data


@pytest.mark.parametrize("level", ["mix", "L0"])
def test_gradient_accumulation_under_ddp_records_the_same_on_the_device_path(tmp_path, monkeypatch, level):
    """Each backward pass adds into .grad in place, and DDP averages it at the pass's end: the device path's
    gradient records (read in batches; at L0 nothing intercepts an API to launch them early) must be the host
    path's (read at once), on both ranks, with nothing logged as changed in place."""
    script = tmp_path / "accumulating.py"
    script.write_text(ACCUMULATING_WORKER)
    dumps = {}
    for device_path in ("0", "1"):
        monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", device_path)
        root = tmp_path / f"dump{device_path}"
        assert sorted(collect(launch(script, root, free_ports(1)[0], config=level))) == [0, 1]
        for rank in (0, 1):
            assert not os.path.exists(os.path.join(root, "step0", f"rank{rank}", "dump_error_info.log"))
        dumps[device_path] = [models.record_leaves(rank_data(root, rank)) for rank in (0, 1)]
    for host, device in zip(dumps["0"], dumps["1"]):
        assert any(".backward." in k and ".output" in k for k in host) and any("parameters_grad" in k for k in host)
        models.assert_same_leaves(host, device)

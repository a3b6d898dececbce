"""Diagnosis across ranks: two real gloo processes train the planted model under DDP, each dumping a
golden run and a target run; in the target run only rank 1 computes its softmax in bfloat16. The logits
are all_reduced (a recorded collective) and DDP all-reduces the gradients (inside autograd, unrecorded),
so rank 0's values diverge too, but only by receiving rank 1's: the diagnosis must name rank 1's
softmax first and list rank 0's entry points as received, not introduced.
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

from msprobe.core.diagnosis import diagnose, format_diagnosis  # noqa: E402
from msprobe.core.compare.engine import compare_dumps  # noqa: E402

if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
PLANTED_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "compare")  # planted.py

WORKER = textwrap.dedent('''
    import datetime, sys
    import torch
    import torch.distributed as dist
    sys.path.insert(0, sys.argv[2])
    import planted

    root, task = sys.argv[1], sys.argv[3]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()

    def exchange(t):
        dist.all_reduce(t)
        return t

    def ddp(model):
        return torch.nn.parallel.DistributedDataParallel(model)

    plant = "bf16_softmax" if rank == 1 else None
    planted.dump_run(f"{root}/golden", None, task=task, rank=rank, exchange=exchange, wrap=ddp)
    planted.dump_run(f"{root}/target", plant, task=task, rank=rank, exchange=exchange, wrap=ddp)
    # DDP alone: rank 1's error reaches rank 0 only through the unrecorded gradient all-reduce
    planted.dump_run(f"{root}/golden_ddp", None, task=task, rank=rank, wrap=ddp)
    planted.dump_run(f"{root}/target_ddp", plant, task=task, rank=rank, wrap=ddp)
    dist.barrier()
    dist.destroy_process_group()
''')


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_two_ranks(tmp_path, task):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path), PLANTED_DIR, task], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, f"rank process failed ({p.returncode}):\n{out}\n{err}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return tmp_path


@pytest.fixture(scope="module")
def two_rank_dumps(tmp_path_factory):
    return _run_two_ranks(tmp_path_factory.mktemp("diag_dist"), "statistics")


def test_rank1_planted_softmax_named_first(two_rank_dumps):
    target, golden = str(two_rank_dumps / "target"), str(two_rank_dumps / "golden")
    results = compare_dumps(target, golden, progress=False)
    assert sorted(r.rank for r in results) == [0, 1]
    d = diagnose(results)
    json.dumps(d.to_json(), allow_nan=False)
    assert d["divergence"] is True
    top = d["suspects"][0]
    assert top["api"] == "Functional.softmax.0.forward"
    assert top["ranks"] == [1] and top["direction"] == "forward"
    assert "rank 1" in d["verdict"] and d["verdict"].endswith("rank 0 only receives it from other ranks")
    text = format_diagnosis(d)
    assert "Functional.softmax.0.forward" in text.splitlines()[0] and "rank 1" in text.splitlines()[0]


def test_rank0_divergence_is_received_through_the_collective(two_rank_dumps):
    target, golden = str(two_rank_dumps / "target"), str(two_rank_dumps / "golden")
    d = diagnose(compare_dumps(target, golden, progress=False))
    by_rank = {r["rank"]: r for r in d["ranks"]}
    assert by_rank[0]["diverging_calls"] > 0           # rank 0's values do differ ...
    rank0 = [s for s in d["suspects"] if 0 in s["ranks"]]
    assert rank0, "rank 0 diverges; its entry point must be listed"
    # ... but only where the recorded all_reduce of the logits hands it rank 1's values, ranked after
    # rank 1's introducer.
    assert [(s["api"], s["kind"]) for s in rank0] == [("Distributed.all_reduce.0.forward", "communication")]
    assert d["suspects"].index(rank0[0]) > 0
    assert by_rank[0]["first_divergence"] == "Distributed.all_reduce.0.forward"


def test_rank0_divergence_through_ddp_gradients_is_received(two_rank_dumps):
    """Without the recorded collective, rank 0 first differs where the optimizer reads gradients DDP
    all-reduced inside autograd: an input no recorded call produced, after rank 1 diverged."""
    d = diagnose(compare_dumps(str(two_rank_dumps / "target_ddp"), str(two_rank_dumps / "golden_ddp"),
                               progress=False))
    top = d["suspects"][0]
    assert (top["api"], top["ranks"]) == ("Functional.softmax.0.forward", [1])
    by_rank = {r["rank"]: r for r in d["ranks"]}
    assert by_rank[0]["first_divergence"].startswith("Tensor.add_")  # SGD's update of a parameter
    rank0 = [s for s in d["suspects"] if 0 in s["ranks"]]
    assert rank0 and all(s["kind"] == "communication" for s in rank0)
    assert all("rank 1 diverged earlier" in s["reason"] for s in rank0)

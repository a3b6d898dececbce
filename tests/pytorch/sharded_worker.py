"""One rank of the sharded-training tests (run by tests/gloo_ranks.py): a small MLP trained for two steps
under tensor parallelism, FSDP2 and DDP, each once without and once with a PrecisionDebugger at level mix.

    python sharded_worker.py ROOT SETUPS    (SETUPS: comma-separated of tp, tp_planted, tp_compiled, fsdp, fsdp_compiled,
    ddp, ddp_compiled)

Rank 0 first trains the same model in one process (no process group) into ROOT/single: the golden of
the sharded-vs-single compares. Every setup is fed the same batch on every rank (the sharded runs must
compute what the single process does), except ddp, whose ranks each get their own and where
ROOT/ddp_target's last rank scales its input by 1.5 (a rank-local bug); ddp also all_reduces the
outputs (a recorded collective), so that the other ranks receive that rank's error. Prints one line
`RESULT {json}`: the losses of each setup without and with the dump.
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from msprobe.pytorch import PrecisionDebugger

root, setups = sys.argv[1], sys.argv[2].split(",")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def batch(step, own=False):
    seed = step * 100 + (rank if own else 0)
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(seed))


def train(model, dump=None, own_batch=False, scale=1.0, exchange=False):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(dump_path=dump, level="mix") if dump else None
    losses = []
    for step in range(2):
        if debugger:
            debugger.start(model)
        out = model(batch(step, own_batch) * scale)
        if exchange:
            total = out.detach().clone()
            dist.all_reduce(total)
            out = out + 1e-3 * total
        loss = out.square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if debugger:
            debugger.stop()
            debugger.step()
        losses.append(loss.item())
    if debugger:
        debugger.close()
    return losses


def build(setup, mesh):
    torch.manual_seed(0)
    model = MLP()
    if setup.startswith("tp"):
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        if setup == "tp_planted" and rank == world - 1:
            with torch.no_grad():  # one element of the last rank's shard of up.weight
                model.up.weight._local_tensor[0, 0] += 0.5
        if setup == "tp_compiled":
            model.compile(backend="aot_eager")
    elif setup.startswith("fsdp"):
        from torch.distributed.fsdp import fully_shard
        if setup == "fsdp_compiled":  # (torchtitan's way: each block compiled, then sharded)
            model.up.compile(backend="aot_eager")
        fully_shard(model.up, mesh=mesh)
        fully_shard(model.down, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif setup == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    elif setup == "ddp_compiled":  # (every rank fed the same batch, as the sharded setups are)
        model = torch.compile(nn.parallel.DistributedDataParallel(model), backend="aot_eager")
    return model


if rank == 0:
    torch.manual_seed(0)
    train(MLP(), f"{root}/single")
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

mesh = init_device_mesh("cpu", (world,))
result = {}
for setup in setups:
    ddp = setup == "ddp"
    plain = train(build(setup, mesh), own_batch=ddp, exchange=ddp)
    dumped = train(build(setup, mesh), f"{root}/{setup}", own_batch=ddp, exchange=ddp)
    result[setup] = {"plain": plain, "dumped": dumped}
    if ddp:
        scale = 1.5 if rank == world - 1 else 1.0
        train(build(setup, mesh), f"{root}/ddp_target", own_batch=True, scale=scale, exchange=True)
dist.barrier()
dist.destroy_process_group()
print("RESULT " + json.dumps(result), flush=True)

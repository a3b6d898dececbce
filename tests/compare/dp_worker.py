"""One rank of the data-parallel tests (run by tests/gloo_ranks.py): a small MLP trained one SGD step with
mean-reduced MSE, its ranks each holding a part of the batch, under DDP, FSDP2 and a plain gloo
all-reduce of the gradients, each at level mix into ROOT/SETUP; rank 0 first trains the same model on
the whole batch in one process into ROOT/single (the golden).

    python dp_worker.py ROOT SETUPS SPLIT TASK [ROOT SETUPS SPLIT TASK ...]
        SETUPS: comma list of ddp, fsdp, allreduce, planted; SPLIT: the rows of each rank, e.g. 4,4 or 5,3;
        TASK: statistics or tensor. Several runs share one launch of the ranks (their start-up is most
        of the cost).

`planted` is DDP with one weight of the last rank's copy perturbed after DDP broadcast rank 0's.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from msprobe.pytorch import PrecisionDebugger

RUNS = [(root, setups.split(","), [int(n) for n in split.split(",")], task)
        for root, setups, split, task in zip(*[iter(sys.argv[1:])] * 4)]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def whole_batch(split):
    gen = torch.Generator().manual_seed(7)
    return torch.randn(sum(split), 16, generator=gen), torch.randn(sum(split), 4, generator=gen)


def train(model, dump, part, split, task, after_backward=None):
    x, y = whole_batch(split)
    if part is not None:
        start = sum(split[:part])
        x, y = x[start:start + split[part]], y[start:start + split[part]]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(dump_path=dump, level="mix", task=task)
    debugger.start(model)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    if after_backward is not None:
        after_backward(model)
    opt.step()
    debugger.stop()
    debugger.step()
    debugger.close()


def average_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world


def build(setup, mesh):
    torch.manual_seed(0)
    model = MLP()
    if setup in ("ddp", "planted"):
        model = nn.parallel.DistributedDataParallel(model)
        if setup == "planted" and rank == world - 1:
            with torch.no_grad():
                model.module.up.weight[0, 0] += 0.5
    elif setup == "fsdp":
        from torch.distributed.fsdp import fully_shard
        fully_shard(model.up, mesh=mesh)
        fully_shard(model.down, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


if rank == 0:
    for root, _, split, task in RUNS:
        torch.manual_seed(0)
        train(MLP(), f"{root}/single", None, split, task)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

mesh = init_device_mesh("cpu", (world,))
for root, setups, split, task in RUNS:
    for setup in setups:
        train(build(setup, mesh), f"{root}/{setup}", rank, split, task,
              average_gradients if setup == "allreduce" else None)
dist.barrier()
dist.destroy_process_group()

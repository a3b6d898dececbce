"""Dumps for the graph tests and benchmark, made with our PyTorch dumper at level mix.

`dump_transformer(path, perturbed=...)` trains a small pre-norm transformer for one step (several
micro-batches when asked) under `PrecisionDebugger(level="mix")`. The perturbed run differs from the
fp32 golden in two planted ways inside block 1:

- the attention scores are multiplied by `SCORE_SCALE` instead of 1 (same API, same call index, a
  different scalar argument and a far larger output: compare flags it as an error), and
- an extra `torch.clamp` runs after the block (an API golden does not have: unmatched).
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from msprobe.pytorch import PrecisionDebugger, seed_all

SCORE_SCALE = 8.0
PERTURBED_BLOCK = 1


class Block(nn.Module):
    """`up_name` renames the first MLP layer (a refactored model: same weights, another module path)."""

    def __init__(self, d, heads, index, up_name="fc1"):
        super().__init__()
        self.heads, self.index, self.up_name = heads, index, up_name
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        setattr(self, up_name, nn.Linear(d, 2 * d))
        self.fc2 = nn.Linear(2 * d, d)
        self.perturbed = False

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scale = SCORE_SCALE if self.perturbed else 1.0
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        att = F.softmax(scores, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        x = x + self.fc2(F.gelu(getattr(self, self.up_name)(self.ln2(x))))
        if self.perturbed:
            x = torch.clamp(x, -1e4, 1e4)
        return x


class TinyTransformer(nn.Module):
    def __init__(self, layers=2, d=16, heads=2, vocab=32, perturbed=False, up_name="fc1", extra_add=False):
        super().__init__()
        self.extra_add = extra_add  # one more `x + 0.0` first: every later Tensor.__add__ index shifts by one
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, i, up_name) for i in range(layers))
        if perturbed and layers > PERTURBED_BLOCK:
            self.blocks[PERTURBED_BLOCK].perturbed = True
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        if self.extra_add:
            x = x + 0.0
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def dump_transformer(dump_path, perturbed=False, layers=2, micro_batches=1, d=16, task="statistics",
                     rank_id=None, steps=1, up_name="fc1", collective=False, extra_add=False):
    """Dump `steps` training steps; returns the step-0 rank directory (`step0/rank{R}` or `proc{pid}`)."""
    seed_all(1234)
    model = TinyTransformer(layers=layers, d=d, perturbed=perturbed, up_name=up_name, extra_add=extra_add)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(7)
    batches = [torch.randint(0, 32, (2, 9), generator=gen) for _ in range(micro_batches)]
    debugger = PrecisionDebugger(dump_path=str(dump_path), task=task, level="mix")
    for _ in range(steps):
        if rank_id is None:
            debugger.start(model)
        else:
            debugger.start(model, rank_id=rank_id)
        for tokens in batches:
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
            (loss / micro_batches).backward()
            if collective:  # a recorded all_reduce, as data parallelism would do with the loss
                import torch.distributed as dist
                dist.all_reduce(loss.detach().clone())
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
    debugger.close()
    step0 = os.path.join(str(dump_path), "step0")
    if rank_id is not None or collective:
        import torch.distributed as dist
        return os.path.join(step0, f"rank{dist.get_rank() if rank_id is None else rank_id}")
    (rank_dir,) = os.listdir(step0)
    return os.path.join(step0, rank_dir)


class Overflowing(nn.Module):
    """A Linear followed by exp of large values: exp turns finite inputs into inf."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.exp(self.fc(x) * 1000.0).sum()


def dump_overflow(dump_path):
    """Forward-only mix dump of `Overflowing`; returns the rank directory."""
    seed_all(1)
    model = Overflowing()
    debugger = PrecisionDebugger(dump_path=str(dump_path), task="statistics", level="mix")
    debugger.start(model)
    with torch.no_grad():
        model(torch.ones(2, 4))
    debugger.stop()
    debugger.step()
    debugger.close()
    step0 = os.path.join(str(dump_path), "step0")
    (rank_dir,) = os.listdir(step0)
    return os.path.join(step0, rank_dir)


def _renamer(keys):
    """key -> function(copy) giving the key of the same call in micro-batch `copy` (call indexes shifted
    by the number of calls of that name in one micro-batch, as the dumper numbers them)."""
    from msprobe.core.naming import api_key, is_module_key, module_key, params_grad_key, split_key

    counts = {}
    for k in keys:
        base, direction, index = split_key(k)
        if direction:
            counts[base] = max(counts.get(base, 0), index + 1)

    def rename(key, copy):
        base, direction, index = split_key(key)
        if not direction or copy == 0:
            return key
        n = index + copy * counts[base]
        prefix, rest = base.split(".", 1)
        if is_module_key(key):
            path, cls = rest.rsplit(".", 1)
            if direction == "parameters_grad":
                return params_grad_key(prefix, path, cls, n)
            return module_key(prefix, path, cls, direction, n)
        return api_key(prefix, rest, n, direction)
    return rename


def tile_dump(src_rank_dir, dst_rank_dir, copies):
    """Write a dump of `copies` micro-batches from a one-micro-batch dump: every call except the
    optimizer's is repeated with shifted call indexes (dump.json, construct.json and stack.json)."""
    import json

    def load(name):
        with open(os.path.join(src_rank_dir, name)) as f:
            return json.load(f)

    dump, construct, stack = load("dump.json"), load("construct.json"), load("stack.json")
    once = {k for k, parent in construct.items() if parent == "optimizer"}
    rename = _renamer(list(dump["data"]) + list(construct))
    data, new_construct, new_stack = {}, {}, {}
    for c in range(copies):
        for k, rec in dump["data"].items():
            if k not in once or c == 0:
                data[rename(k, c)] = rec
        for k, parent in construct.items():
            if k not in once or c == 0:
                new_construct[rename(k, c)] = rename(parent, c) if parent else parent
    for sid, (keys, lines) in stack.items():
        new_stack[sid] = [[rename(k, c) for c in range(copies) for k in keys if k not in once or c == 0], lines]
    os.makedirs(dst_rank_dir, exist_ok=True)
    for name, obj in (("dump.json", dict(dump, data=data)), ("construct.json", new_construct),
                      ("stack.json", new_stack)):
        with open(os.path.join(dst_rank_dir, name), "w") as f:
            json.dump(obj, f)
    return dst_rank_dir


def dump_two_ranks(root, perturbed_rank=1, steps=2, layers=2):
    """Golden and target dumps of a real 2-process gloo run: `root/golden` and `root/target`, each
    with step{S}/rank{0,1}; the target differs only on `perturbed_rank`."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", str(root),
                                       str(perturbed_rank), str(steps), str(layers)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
    return os.path.join(str(root), "golden"), os.path.join(str(root), "target")


def _worker(root, perturbed_rank, steps, layers):
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    dump_transformer(os.path.join(root, "golden"), layers=layers, steps=steps, collective=True)
    dump_transformer(os.path.join(root, "target"), layers=layers, steps=steps, collective=True,
                     perturbed=rank == perturbed_rank)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "worker":
    _worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))

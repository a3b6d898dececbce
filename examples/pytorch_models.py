"""Three small PyTorch models with a training loop each, used by `examples/train.py`, the README tour and
the tests that must hold on ordinary training (the monitor's quiet defaults, acc_check's coverage).

- `mlp`: 32 -> 64 -> 64 -> 8 with ReLU, regression onto a fixed random teacher (MSE, Adam).
- `transformer`: token embedding + zero-initialised positions, 2 pre-LayerNorm blocks (attention with
  `matmul`/`softmax`, GELU MLP), next-token cross entropy on random tokens (AdamW).
- `cnn`: 2 x (conv 3x3, BatchNorm, ReLU, maxpool 2), then a linear classifier (cross entropy, SGD with
  momentum).

Every step draws a fresh batch from a generator seeded once, as a data loader would.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("mlp", "transformer", "cnn")


class MLP(nn.Module):
    def __init__(self, d_in=32, hidden=64, d_out=8):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.head(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Block(nn.Module):
    def __init__(self, d, heads, low_precision_softmax=False):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.low_precision_softmax = low_precision_softmax

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        if self.low_precision_softmax:  # `train.py --plant bf16-softmax`: the difference compare must find
            attn = F.softmax(scores.to(torch.bfloat16), dim=-1).to(torch.float32)
        else:
            attn = F.softmax(scores, dim=-1)
        y = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, blocks=2, seq=16, low_precision_softmax=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads, low_precision_softmax and i == 1) for i in range(blocks))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class CNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


class Workload:
    """A model, its optimizer and its data: `train_step(step)` is zero_grad, forward, loss, backward and
    the optimizer step on that step's batch.

    Args:
        name: one of `MODELS`.
        seed: seeds the weights and the batches.
        low_precision_softmax: transformer only: block 1's softmax in bfloat16.
    """

    def __init__(self, name, seed=0, low_precision_softmax=False):
        if name not in MODELS:
            raise ValueError(f"model {name!r}: allowed: {' | '.join(MODELS)}")
        torch.manual_seed(seed)
        self.name = name
        self.data = torch.Generator().manual_seed(seed + 1)
        if name == "mlp":
            self.model = MLP()
            self.teacher = torch.randn(32, 8, generator=self.data) / math.sqrt(32)
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        elif name == "transformer":
            self.model = Transformer(low_precision_softmax=low_precision_softmax)
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        else:
            self.model = CNN()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.02, momentum=0.9)

    def batch(self):
        """The next batch (inputs, targets)."""
        g = self.data
        if self.name == "mlp":
            x = torch.randn(32, 32, generator=g)
            return x, x @ self.teacher
        if self.name == "transformer":
            tokens = torch.randint(0, 64, (8, 17), generator=g)
            return tokens[:, :-1], tokens[:, 1:]
        return torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)

    def loss(self, out, y):
        if self.name == "mlp":
            return F.mse_loss(out, y)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    def train_step(self, loss_scale=1.0):
        """One training step; `loss_scale` multiplies the loss (a planted gradient spike or NaN).

        Returns:
            the loss as a float.
        """
        x, y = self.batch()
        self.optimizer.zero_grad()
        loss = self.loss(self.model(x), y)
        (loss * loss_scale if loss_scale != 1.0 else loss).backward()
        self.optimizer.step()
        return loss.item()

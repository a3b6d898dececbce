"""The three models of `pytorch_models.py` in MindSpore (PyNative), with the same kind of training loop:
`value_and_grad` over the optimizer's parameters, then `optimizer(grads)`.

- `mlp`: nn.Dense 32 -> 64 -> 64 -> 8 with ReLU, regression onto a fixed random teacher (MSE, Adam).
- `transformer`: nn.Embedding + zero-initialised positions, 2 pre-LayerNorm blocks (attention with
  `ops.matmul`/`ops.softmax`, GELU MLP), next-token cross entropy on random tokens (Adam).
- `cnn`: 2 x (nn.Conv2d 3x3, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d 2), then nn.Dense (cross entropy,
  Momentum).

Every step draws a fresh batch from a generator seeded once, as a data loader would.
"""

from msprobe.mindspore import seed_all  # first: sets MindSpore up for numpy 2

import mindspore as ms
import numpy as np
from mindspore import nn, ops

MODELS = ("mlp", "transformer", "cnn")


class MLP(nn.Cell):
    def __init__(self, d_in=32, hidden=64, d_out=8):
        super().__init__()
        self.fc1 = nn.Dense(d_in, hidden, activation="relu")
        self.fc2 = nn.Dense(hidden, hidden, activation="relu")
        self.head = nn.Dense(hidden, d_out)

    def construct(self, x):
        return self.head(self.fc2(self.fc1(x)))


class Block(nn.Cell):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm((d,))
        self.qkv = nn.Dense(d, 3 * d)
        self.proj = nn.Dense(d, d)
        self.ln2 = nn.LayerNorm((d,))
        self.fc1 = nn.Dense(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Dense(4 * d, d)

    def construct(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = ops.split(self.qkv(self.ln1(x)), d, axis=-1)
        q, k, v = (z.reshape(b, t, h, d // h).transpose(0, 2, 1, 3) for z in (q, k, v))
        attn = ops.softmax(ops.matmul(q, k.transpose(0, 1, 3, 2)) * (d // h) ** -0.5, axis=-1)
        y = ops.matmul(attn, v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class Transformer(nn.Cell):
    def __init__(self, vocab=64, d=32, heads=4, blocks=2, seq=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = ms.Parameter(ms.Tensor(np.zeros((seq, d), np.float32)), name="pos")
        self.blocks = nn.CellList([Block(d, heads) for _ in range(blocks)])
        self.ln_f = nn.LayerNorm((d,))
        self.head = nn.Dense(d, vocab)

    def construct(self, idx):
        x = self.tok(idx) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class CNN(nn.Cell):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.SequentialCell([
            nn.Conv2d(3, 8, 3, pad_mode="same", has_bias=True), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d(2, 2),
            nn.Conv2d(8, 16, 3, pad_mode="same", has_bias=True), nn.BatchNorm2d(16), nn.ReLU(),
            nn.MaxPool2d(2, 2)])
        self.flat = nn.Flatten()
        self.fc = nn.Dense(16 * 4 * 4, classes)

    def construct(self, x):
        return self.fc(self.flat(self.features(x)))


class Workload:
    """A network, its optimizer and its data: `train_step()` computes loss and gradients of that step's
    batch with `value_and_grad` and applies them.

    Args:
        name: one of `MODELS`.
        seed: seeds the weights and the batches.
    """

    def __init__(self, name, seed=0):
        if name not in MODELS:
            raise ValueError(f"model {name!r}: allowed: {' | '.join(MODELS)}")
        seed_all(seed)
        self.name = name
        self.data = np.random.default_rng(seed + 1)
        self.model = {"mlp": MLP, "transformer": Transformer, "cnn": CNN}[name]()
        params = self.model.trainable_params()
        if name == "cnn":
            self.optimizer = nn.Momentum(params, learning_rate=0.02, momentum=0.9)
        else:
            self.optimizer = nn.AdamWeightDecay(params, learning_rate=1e-3)
        self.teacher = (self.data.standard_normal((32, 8)) / np.sqrt(32)).astype(np.float32)
        self.model.set_train()
        self._grad_fn = ms.value_and_grad(self._scaled_loss, None, self.optimizer.parameters,
                                          has_aux=True)

    def batch(self):
        """The next batch (inputs, targets) as MindSpore tensors."""
        rng = self.data
        if self.name == "mlp":
            x = rng.standard_normal((32, 32)).astype(np.float32)
            return ms.Tensor(x), ms.Tensor(x @ self.teacher)
        if self.name == "transformer":
            tokens = rng.integers(0, 64, (8, 17)).astype(np.int32)
            return ms.Tensor(tokens[:, :-1]), ms.Tensor(tokens[:, 1:])
        x = rng.standard_normal((16, 3, 16, 16)).astype(np.float32)
        return ms.Tensor(x), ms.Tensor(rng.integers(0, 10, (16,)).astype(np.int32))

    def loss(self, out, y):
        if self.name == "mlp":
            return ops.mse_loss(out, y)
        return ops.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    def _scaled_loss(self, x, y, scale):
        loss = self.loss(self.model(x), y)
        return loss * scale, loss

    def train_step(self, loss_scale=1.0):
        """One training step; `loss_scale` multiplies the loss (a planted gradient spike or NaN).

        Returns:
            the loss as a float.
        """
        x, y = self.batch()
        (_, loss), grads = self._grad_fn(x, y, ms.Tensor(loss_scale, ms.float32))
        self.optimizer(grads)
        return float(loss.asnumpy())

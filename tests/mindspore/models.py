"""Small MindSpore models and training loops shared by the MindSpore tests: a mint MLP, a CNN
(nn.Conv2d, pooling) and a transformer block, trained with value_and_grad + an optimizer or with
mindspore.train.Model + MsprobeStep."""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import mint, nn

from msprobe.mindspore import MsprobeStep, PrecisionDebugger, seed_all


class MintMLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = mint.nn.Linear(16, 32)
        self.fc2 = mint.nn.Linear(32, 32)
        self.head = mint.nn.Linear(32, 4)

    def construct(self, x):
        h = mint.nn.functional.relu(self.fc1(x))
        h = mint.tanh(self.fc2(h)) + h
        return self.head(h)


class CNN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, pad_mode="same", has_bias=True)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(4, 8, 3, pad_mode="valid", has_bias=True)
        self.avg = nn.AvgPool2d(2, 2)
        self.flat = nn.Flatten()
        self.fc = nn.Dense(8, 4)

    def construct(self, x):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.avg(self.relu(self.conv2(x)))
        return self.fc(self.flat(x))


class Attention(nn.Cell):
    def __init__(self, dim):
        super().__init__()
        self.q = mint.nn.Linear(dim, dim)
        self.k = mint.nn.Linear(dim, dim)
        self.v = mint.nn.Linear(dim, dim)
        self.o = mint.nn.Linear(dim, dim)
        self.scale = dim ** -0.5

    def construct(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        att = mint.softmax(mint.matmul(q, k.transpose(0, 2, 1)) * self.scale, dim=-1)
        return self.o(mint.matmul(att, v))


class TransformerBlock(nn.Cell):
    def __init__(self, dim=16):
        super().__init__()
        self.norm1 = nn.LayerNorm((dim,))
        self.attn = Attention(dim)
        self.norm2 = nn.LayerNorm((dim,))
        self.mlp = nn.SequentialCell([mint.nn.Linear(dim, 2 * dim), nn.GELU(), mint.nn.Linear(2 * dim, dim)])
        self.head = mint.nn.Linear(dim, 4)

    def construct(self, x):
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return self.head(mint.mean(x, dim=1))


MODELS = {"mlp": MintMLP, "cnn": CNN, "transformer": TransformerBlock}


def make_data(name, batch=4, seed=0):
    rng = np.random.default_rng(seed)
    shape = {"mlp": (batch, 16), "jit": (batch, 16), "cnn": (batch, 1, 8, 8), "transformer": (batch, 6, 16)}[name]
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.standard_normal((batch, 4)).astype(np.float32)
    return x, y


def build(name, seed=1234):
    seed_all(seed)
    return MODELS[name]()


def train(net, x, y, steps=2, debugger=None, start_model=True):
    """value_and_grad + SGD for `steps` steps; returns the losses. With a debugger: start/stop/step."""
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)

    def loss_fn(xb, yb):
        return mint.mean((net(xb) - yb) ** 2)

    grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters)
    return run_steps(grad_fn, opt, ms.Tensor(x), ms.Tensor(y), steps, debugger, net if start_model else None)


def run_steps(grad_fn, opt, x, y, steps, debugger=None, model=None):
    """`steps` steps of `grad_fn` (value_and_grad) and `opt` on one batch; with a debugger,
    start(model)/stop/step around each. Returns the losses."""
    losses = []
    for _ in range(steps):
        if debugger is not None:
            debugger.start(model)
        loss, grads = grad_fn(x, y)
        opt(grads)
        if debugger is not None:
            debugger.stop()
            debugger.step()
        losses.append(float(loss.asnumpy()))
    return losses


def train_with_model(net, x, y, steps=2, debugger=None):
    """mindspore.train.Model.train for `steps` steps (one batch each), MsprobeStep driving the debugger.
    Returns the losses the network computed (recorded by a callback)."""
    from mindspore.train import Callback, Model

    losses = []

    class Losses(Callback):
        def on_train_step_end(self, run_context):
            losses.append(float(run_context.original_args().net_outputs.asnumpy()))

    n = len(x) // steps

    def batches():
        for i in range(steps):
            yield x[i * n:(i + 1) * n], y[i * n:(i + 1) * n]
    data = ds.GeneratorDataset(batches, ["x", "y"], shuffle=False)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    callbacks = [Losses()]
    if debugger is not None:
        debugger.start(net)
        callbacks.insert(0, MsprobeStep(debugger))
    Model(net, loss_fn=nn.MSELoss(), optimizer=opt).train(1, data, callbacks=callbacks, dataset_sink_mode=False)
    return losses


def run_dump(tmp_path, name, level, task="statistics", summary_mode=None, steps=2, **cfg):
    """Train model `name` for `steps` steps under a debugger; returns (dump root, losses)."""
    import json
    config = {"task": task, "dump_path": str(tmp_path / "dump"), "level": level,
              task: {"summary_mode": summary_mode or "statistics", **cfg}}
    if task != "statistics":
        config[task].pop("summary_mode")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    net = build(name)
    x, y = make_data(name)
    debugger = PrecisionDebugger(config_path=str(path))
    losses = train(net, x, y, steps=steps, debugger=debugger)
    debugger.close()
    return tmp_path / "dump", losses


class JitBlock(nn.Cell):
    """A Cell whose construct MindSpore compiles (mindspore.jit) inside a PyNative run."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(16, 16)
        self.act = nn.ReLU()

    @ms.jit
    def construct(self, x):
        return self.act(self.fc(x))


class JitNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.inp = mint.nn.Linear(16, 16)
        self.block = JitBlock()
        self.head = mint.nn.Linear(16, 4)

    def construct(self, x):
        return self.head(self.block(mint.tanh(self.inp(x))))


MODELS["jit"] = JitNet


class SharedUse(nn.Cell):
    """Gradients that are a call's share of a tensor's: the data input into a LayerNorm, one tensor
    feeding two calls and a Cell, a call taking one tensor twice, an output nothing uses, an integer
    index, a Cell called twice, an input handed back (astype to its own dtype), in-place calls."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm((8,))
        self.a = mint.nn.Linear(8, 8)
        self.b = mint.nn.Linear(8, 8)
        self.act = nn.ReLU()

    def construct(self, x, idx):
        h = self.a(self.norm(x))
        u = mint.mul(h, h)
        v = mint.sin(h) + self.b(h)
        p, _, r = mint.chunk(v, 3, -1)
        g = ms.ops.gather(u, idx, 0)
        w = self.act(self.act(p))
        s = w.astype(w.dtype)
        z = mint.mul(x, 2.0)
        z[0] = 1.0
        z = z.add_(x)
        return g.sum() + s.sum() + r.mean() + (z * z).sum()


def train_shared_use(debugger, steps=2):
    """SharedUse for `steps` steps (gradients of the Parameters), then one step that differentiates
    the input too; the debugger started on the model each step."""
    seed_all(7)
    net = SharedUse()
    rng = np.random.default_rng(3)
    x = ms.Tensor(rng.standard_normal((4, 8)).astype(np.float32))
    idx = ms.Tensor(np.array([0, 2], np.int32))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
    for position in [None] * steps + [0]:
        grad_fn = ms.value_and_grad(lambda a, b: net(a, b), position, opt.parameters)
        debugger.start(net)
        _, grads = grad_fn(x, idx)
        opt(grads[1] if position is not None else grads)
        debugger.stop()
        debugger.step()

"""Small models with one switchable planted bug each, trained one step in fp32 (the golden) and under
whole-model bf16 (or fp16) autocast (the target): the comparison users make most, where every value
differs a little and only one place differs more. A transformer (PLANTS, below: the suite the
diagnosis' thresholds were set on), a CNN (CNN_PLANTS) and an MLP-mixer (MIXER_PLANTS), both written
after the thresholds were set.

Used by tests/core/diagnosis/test_noise_aware.py and benchmarks/bf16_diagnosis.py (the hit / false-alarm table).

| plant | what changes in the target | where error is introduced (accepted suspect #1) |
|---|---|---|
| `eps_b0_ln1` | block 0's first LayerNorm has eps 0.5 instead of 1e-5 | that `layer_norm` (module `blocks.0.ln1`) |
| `eps_b1_ln2` | block 1's second LayerNorm has eps 0.5 | that `layer_norm` (module `blocks.1.ln2`) |
| `weight_b0_q` | one element of block 0's q weight moved by 20% of the weight's range | that `linear` / its weight |
| `weight_b1_fc2` | one element of block 1's fc2 weight moved by 20% of its range | that `linear` / its weight |
| `scale_b1` | block 1's attention scores scaled by 1/d instead of 1/sqrt(d) | that `__mul__` |
| `scale_b0_residual` | block 0's MLP branch added with weight 1.5 instead of 1 | that `__mul__` |
| `fp8_b0_fc1` | block 0's MLP input rounded through float8_e4m3fn (below autocast's precision) | the cast or `linear` |
| `fp8_b1_o` | block 1's attention output rounded through float8_e4m3fn before its projection | the cast or `linear` |
| `fp16_exp_b0` | block 0's (max-free) softmax takes `exp` in float16: it overflows | that `exp` |

Negative controls (no bug, so no divergence beyond the autocast dtype's precision): `none` under
bf16 autocast, `none` with another seed and batch, `none` under fp16 autocast.

Every run of one seed starts from the same weights and batch; the golden is the same model with no
plant, in fp32, no autocast.
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # dumped_training.py lies beside this file, whichever way it was loaded
    sys.path.append(HERE)
from dumped_training import train_dumped  # noqa: E402

VOCAB, DIM, SEQ, BATCH, BLOCKS = 64, 32, 16, 2, 2

# plant -> the calls accepted as suspect #1 (the same keys at level L1 and mix: the plants keep the
# call sequence of the golden) and, at mix, the module whose own call may be named instead.
PLANTS = {
    "eps_b0_ln1": (("Functional.layer_norm.0.forward",), "Module.blocks.0.ln1.LayerNorm.forward.0"),
    "eps_b1_ln2": (("Functional.layer_norm.3.forward",), "Module.blocks.1.ln2.LayerNorm.forward.0"),
    "weight_b0_q": (("Functional.linear.0.forward",), "Module.blocks.0.q.Linear.forward.0"),
    "weight_b1_fc2": (("Functional.linear.11.forward",), "Module.blocks.1.fc2.Linear.forward.0"),
    "scale_b1": (("Tensor.__mul__.2.forward",), None),
    "scale_b0_residual": (("Tensor.__mul__.1.forward",), None),
    "fp8_b0_fc1": (("Tensor.to.4.forward", "Tensor.to.5.forward", "Functional.linear.4.forward"),
                   "Module.blocks.0.fc1.Linear.forward.0"),
    "fp8_b1_o": (("Tensor.to.8.forward", "Tensor.to.9.forward", "Functional.linear.9.forward"),
                 "Module.blocks.1.o.Linear.forward.0"),
    "fp16_exp_b0": (("Torch.exp.0.forward",), None),
}
# negative controls: name -> (seed, autocast dtype)
CONTROLS = {"none": (0, torch.bfloat16), "none_seed1": (1, torch.bfloat16), "none_fp16": (0, torch.float16)}


class Block(nn.Module):
    """Pre-norm block: single-head attention with a max-free softmax, GELU MLP."""

    def __init__(self, index, plant):
        super().__init__()
        here = f"b{index}"
        self.ln1 = nn.LayerNorm(DIM, eps=0.5 if plant == f"eps_{here}_ln1" else 1e-5)
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))
        self.ln2 = nn.LayerNorm(DIM, eps=0.5 if plant == f"eps_{here}_ln2" else 1e-5)
        self.fc1 = nn.Linear(DIM, 4 * DIM)
        self.fc2 = nn.Linear(4 * DIM, DIM)
        self.scale = 1.0 / DIM if plant == f"scale_{here}" else DIM ** -0.5
        self.mlp_weight = 1.5 if plant == f"scale_{here}_residual" else 1.0
        self.exp_dtype = torch.float16 if plant == f"fp16_exp_{here}" else torch.float32
        self.fp8_at = {f"fp8_{here}_fc1": "fc1", f"fp8_{here}_o": "o"}.get(plant)

    def _rounded(self, x, where):
        """x itself, or x rounded through float8 when this is where the fp8 plant sits (the same two
        casts run in every variant, so call indices stay aligned)."""
        low = torch.float8_e4m3fn if self.fp8_at == where else x.dtype
        return x.to(low).to(x.dtype)

    def forward(self, x):
        h = self.ln1(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        s = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        e = torch.exp(s.to(self.exp_dtype))  # no max subtracted: fine in fp32 at these scores
        p = (e / e.sum(-1, keepdim=True)).to(v.dtype)
        a = self._rounded(torch.matmul(p, v), "o")
        x = x + self.o(a)
        h = self._rounded(self.ln2(x), "fc1")
        return x + self.fc2(F.gelu(self.fc1(h))) * self.mlp_weight


class Net(nn.Module):
    def __init__(self, plant=None):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(i, plant) for i in range(BLOCKS))
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build(plant=None, seed=0):
    """The model with the same weights for every plant of a seed; weight plants then move one element."""
    torch.manual_seed(seed)
    model = Net(plant)
    with torch.no_grad():
        for block in model.blocks:  # attention scores large enough that fp16 exp overflows
            nn.init.normal_(block.q.weight, std=0.4)
            nn.init.normal_(block.k.weight, std=0.4)
        target = {"weight_b0_q": model.blocks[0].q, "weight_b1_fc2": model.blocks[1].fc2}.get(plant)
        if target is not None:
            w = target.weight
            w[1, 3] += 0.2 * float(w.max() - w.min())
    return model


def batch(seed=0):
    gen = torch.Generator().manual_seed(100 + seed)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


# --- held-out suite: a small CNN, planted after the diagnosis' thresholds were set on the transformer ---

CNN_PLANTS = {
    "eps_bn": (("Functional.batch_norm.1.forward",), "Module.block_bn.BatchNorm2d.forward.0"),
    "weight_stem": (("Functional.conv2d.0.forward",), "Module.stem.Conv2d.forward.0"),
    "weight_head": (("Functional.linear.2.forward",), "Module.head.Linear.forward.0"),
    "scale_residual": (("Tensor.__mul__.2.forward",), None),
    "fp8_block": (("Tensor.to.0.forward", "Tensor.to.1.forward", "Functional.conv2d.1.forward"),
                  "Module.block_conv.Conv2d.forward.0"),
    "fp16_gate": (("Torch.exp.0.forward",), None),
}


class ConvNet(nn.Module):
    """conv-BN-SiLU stem, a residual block with a squeeze-excitation gate, pooled linear head."""

    def __init__(self, plant=None):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.stem_bn = nn.BatchNorm2d(16)
        self.block_conv = nn.Conv2d(16, 16, 3, padding=1)
        self.block_bn = nn.BatchNorm2d(16, eps=0.5 if plant == "eps_bn" else 1e-5)
        self.se1 = nn.Linear(16, 4)
        self.se2 = nn.Linear(4, 16)
        self.head = nn.Linear(16, 10)
        self.temperature = 50.0  # a sharp gate: exp(-50 s) passes fp16's range for s < -0.23
        self.gate_dtype = torch.float16 if plant == "fp16_gate" else torch.float32
        self.block_dtype = torch.float8_e4m3fn if plant == "fp8_block" else None
        self.residual = 1.5 if plant == "scale_residual" else 1.0

    def forward(self, x):
        h = F.silu(self.stem_bn(self.stem(x)))
        low = self.block_dtype or h.dtype
        b = self.block_bn(self.block_conv(h.to(low).to(h.dtype)))
        s = self.se2(F.relu(self.se1(b.mean((2, 3)))))
        gate = 1.0 / (1.0 + torch.exp(-(s * self.temperature).to(self.gate_dtype)))
        b = b * gate.to(b.dtype)[:, :, None, None]
        h = h + F.silu(b) * self.residual
        return self.head(h.mean((2, 3)))


def build_cnn(plant=None, seed=0):
    torch.manual_seed(seed)
    model = ConvNet(plant)
    with torch.no_grad():
        target = {"weight_stem": model.stem, "weight_head": model.head}.get(plant)
        if target is not None:
            w = target.weight.view(target.weight.shape[0], -1)
            w[1, 3] += 0.2 * float(w.max() - w.min())
    return model


def cnn_batch(seed=0):
    gen = torch.Generator().manual_seed(200 + seed)
    return torch.randn(4, 3, 12, 12, generator=gen), torch.randint(0, 10, (4,), generator=gen)


# --- second held-out suite: an MLP-mixer, written after the CNN's one fix, its numbers as they came ---

MIXER_PLANTS = {
    "eps_token_ln": (("Functional.layer_norm.0.forward",), "Module.token_ln.LayerNorm.forward.0"),
    "weight_channel": (("Functional.linear.2.forward",), "Module.channel_in.Linear.forward.0"),
    "scale_token": (("Tensor.__mul__.0.forward",), None),
    "fp8_channel": (("Tensor.to.0.forward", "Tensor.to.1.forward", "Functional.linear.2.forward"),
                    "Module.channel_in.Linear.forward.0"),
    "fp16_exp_pool": (("Torch.exp.0.forward",), None),
}


class Mixer(nn.Module):
    """One mixer layer over 8 patches of 24 channels: token-mixing MLP across patches (transposed),
    channel-mixing MLP, a softmax-weighted pooling written with exp, a linear head."""

    def __init__(self, plant=None):
        super().__init__()
        self.token_ln = nn.LayerNorm(24, eps=0.5 if plant == "eps_token_ln" else 1e-5)
        self.token_in, self.token_out = nn.Linear(8, 16), nn.Linear(16, 8)
        self.channel_ln = nn.LayerNorm(24)
        self.channel_in, self.channel_out = nn.Linear(24, 48), nn.Linear(48, 24)
        self.pool = nn.Linear(24, 1)
        self.head = nn.Linear(24, 5)
        self.token_scale = 0.3 if plant == "scale_token" else 1.0
        self.channel_dtype = torch.float8_e4m3fn if plant == "fp8_channel" else None
        self.exp_dtype = torch.float16 if plant == "fp16_exp_pool" else torch.float32

    def forward(self, x):
        t = self.token_out(F.silu(self.token_in(self.token_ln(x).transpose(1, 2)))).transpose(1, 2)
        x = x + t * self.token_scale
        h = self.channel_ln(x)
        h = h.to(self.channel_dtype or h.dtype).to(h.dtype)
        x = x + self.channel_out(F.silu(self.channel_in(h)))
        w = torch.exp((self.pool(x) * 30.0).to(self.exp_dtype))  # sharp pooling weights, no max subtracted
        pooled = (x * w.to(x.dtype)).sum(1) / w.to(x.dtype).sum(1)
        return self.head(pooled)


def build_mixer(plant=None, seed=0):
    torch.manual_seed(seed)
    model = Mixer(plant)
    if plant == "weight_channel":
        with torch.no_grad():
            w = model.channel_in.weight
            w[1, 3] += 0.2 * float(w.max() - w.min())
    return model


def mixer_batch(seed=0):
    gen = torch.Generator().manual_seed(300 + seed)
    return torch.randn(4, 8, 24, generator=gen), torch.randint(0, 5, (4,), generator=gen)


def _transformer_loss(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, VOCAB).float(), y.reshape(-1))


def _cnn_loss(model, x, y):
    return F.cross_entropy(model(x).float(), y)


# model name -> (build(plant, seed), batch(seed), plants, loss(model, x, y))
MODELS = {"transformer": (build, batch, PLANTS, _transformer_loss),
          "cnn": (build_cnn, cnn_batch, CNN_PLANTS, _cnn_loss),
          "mixer": (build_mixer, mixer_batch, MIXER_PLANTS, _cnn_loss)}


def dump_run(dump_path, plant=None, *, task="statistics", level="mix", autocast=None, seed=0, model="transformer"):
    """One SGD step of a suite model under a PrecisionDebugger writing dump_path/step0/rank0.

    Args:
        plant: a key of the model's plants (PLANTS, CNN_PLANTS), or None.
        task: "statistics" or "tensor".
        level: "L1" or "mix".
        autocast: torch.bfloat16 / torch.float16 for the target, None for the fp32 golden.
        seed: weights and batch.
        model: "transformer" (the suite the thresholds were set on) or "cnn" (held out).

    Returns:
        dump_path as a string.
    """
    from msprobe.pytorch import PrecisionDebugger

    build_fn, batch_fn, _, loss_fn = MODELS[model]
    dump_path = str(dump_path)
    net = build_fn(plant, seed)
    x, y = batch_fn(seed)
    config = dump_path + ".config.json"
    os.makedirs(os.path.dirname(config) or ".", exist_ok=True)
    with open(config, "w", encoding="utf-8") as f:
        json.dump({"task": task, "level": level, "dump_path": dump_path}, f)
    dumped_step(PrecisionDebugger(config_path=config), net, x, y, loss_fn, autocast)
    return dump_path


def dumped_step(debugger, net, x, y, loss_fn, autocast):
    """One SGD step (lr 0.1) of `net` under `debugger`, under autocast to `autocast` (None: fp32)."""
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def loss_of(x, y):
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            return loss_fn(net, x, y)

    train_dumped(debugger, net, opt, loss_of, [(x, y)])


def hit(plant, suspect, model="transformer"):
    """Whether a diagnosis suspect (an entry of diagnosis.json's `suspects`) names the planted place."""
    calls, module = MODELS[model][2][plant]
    return suspect.get("api") in calls or (module is not None and suspect.get("api") == module)

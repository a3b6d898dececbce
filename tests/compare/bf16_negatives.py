"""Clean models of other shapes for the bf16 diagnosis' false alarms: no bug anywhere, one SGD step in
fp32 (the golden) and under whole-model autocast (the target: bf16, or fp16 where `AUTOCAST` says). A
careful verdict on every one is "no divergence beyond <dtype> precision".

Two halves. `tuning`: the models looked at while the diagnosis (or the dump it reads) was changed: a
GPT-style transformer, the same with a layout-only rewrite of its heads, a conv net with batch norm;
then nn.GRU and nn.MultiheadAttention with a post-norm, an LSTM written out over its time steps with its
time-major layout rewrite, nn.LSTMCell with a hand-written GRU cell stepped by hand, and a chunked
selective state-space scan, each held out until its false alarms were worked on. `held out`: written
beside them and run only to report, their numbers as they came: a deep residual stream with RMSNorm and
SiLU; cross-attention with a SwiGLU MLP; a deeper conv + batch-norm stack; then, written before the
LSTM's alarms were worked on, a causal dilated Conv1d net, rotary and ALiBi attention,
depthwise-separable convs, an EmbeddingBag recommender, and the GPT and the separable conv net under
fp16 autocast; then, written before the cell loop's alarm was worked on, a U-Net, a top-2 mixture of
experts, a small ViT, and convs with instance and group norm; then, before the scan's masked_fill
alarm was looked at, attention pooling over padded sequences.

Used by tests/core/diagnosis/test_noise_aware.py and benchmarks/bf16_diagnosis.py (the false-alarm table per
family and half).
"""

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from private_modules import load_private

plants = load_private("msprobe_bench_autocast_plants",
                      os.path.join(os.path.dirname(os.path.abspath(__file__)), "autocast_plants.py"))


class GptBlock(nn.Module):
    """Pre-norm causal self-attention and a GELU MLP; `layout` "view" splits heads with view/transpose,
    "permute" with reshape/permute (the same math)."""

    def __init__(self, d, heads, layout):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.layout = heads, layout

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        if self.layout == "view":
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        else:
            q, k, v = (z.reshape(b, t, h, d // h).permute(0, 2, 1, 3) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        y = att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        if self.layout == "view":
            y = y.transpose(1, 2).contiguous().view(b, t, d)
        else:
            y = y.permute(0, 2, 1, 3).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, layout="view", vocab=64, d=32, heads=4, blocks=2, t=16):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(t, d)
        self.blocks = nn.ModuleList(GptBlock(d, heads, layout) for _ in range(blocks))
        self.lnf, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.lnf(x))


class ConvBn(nn.Module):
    """Two conv + batch-norm + ReLU stages with a residual add, global pooling, a linear head."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        h = F.relu(self.b1(self.c1(x)))
        h = h + F.relu(self.b2(self.c2(h)))
        return self.head(h.mean(dim=(2, 3)))


class Gru(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.rnn, self.head = nn.Embedding(64, 24), nn.GRU(24, 32, batch_first=True), nn.Linear(32, 64)

    def forward(self, idx):
        out, _ = self.rnn(self.emb(idx))
        return self.head(out)


class Mha(nn.Module):
    """nn.MultiheadAttention with post-norm residuals (another attention variant)."""

    def __init__(self, d=32):
        super().__init__()
        self.emb = nn.Embedding(64, d)
        self.attn, self.norm1 = nn.MultiheadAttention(d, 4, batch_first=True), nn.LayerNorm(d)
        self.ff, self.norm2 = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, d)), nn.LayerNorm(d)
        self.head = nn.Linear(d, 64)

    def forward(self, idx):
        x = self.emb(idx)
        x = self.norm1(x + self.attn(x, x, x, need_weights=False)[0])
        return self.head(self.norm2(x + self.ff(x)))


class RmsResidual(nn.Module):
    """Six residual SiLU layers, each pre-normed with RMSNorm: a long residual stream."""

    def __init__(self, d=32, depth=6):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.norms = nn.ModuleList(nn.RMSNorm(d) for _ in range(depth))
        self.layers = nn.ModuleList(nn.Linear(d, d) for _ in range(depth))
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        h = self.inp(x)
        for norm, layer in zip(self.norms, self.layers):
            h = h + F.silu(layer(norm(h)))
        return self.head(h)


class Lstm(nn.Module):
    """An LSTM written out with linear gates over 16 time steps (nn.LSTM does not run under CPU bf16
    autocast); `time_major` steps through a (time, batch, feature) transpose of the same input (a
    layout-only rewrite: the same weights and math)."""

    def __init__(self, time_major=False, d=24, hidden=32):
        super().__init__()
        self.time_major, self.hidden = time_major, hidden
        self.emb, self.head = nn.Embedding(64, d), nn.Linear(hidden, 64)
        self.ih, self.hh = nn.Linear(d, 4 * hidden), nn.Linear(hidden, 4 * hidden, bias=False)

    def forward(self, idx):
        x = self.emb(idx)
        steps = x.transpose(0, 1) if self.time_major else x
        h = c = torch.zeros(idx.shape[0], self.hidden)
        outs = []
        for t in range(idx.shape[1]):
            xt = steps[t] if self.time_major else steps[:, t]
            i, f, g, o = (self.ih(xt) + self.hh(h)).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return self.head(torch.stack(outs, dim=1))


class CrossAttention(nn.Module):
    """A decoder stream attending to an encoder memory of another length (separate q and kv
    projections, scaled_dot_product_attention), with a gated RMSNorm MLP (SwiGLU) after it."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.emb, self.mem = nn.Embedding(64, d), nn.Embedding(64, d)
        self.q, self.kv, self.o = nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)
        self.norm1, self.norm2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.gate, self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.head, self.heads = nn.Linear(d, 64), heads

    def forward(self, idx):
        b, t = idx.shape
        x, m = self.emb(idx), self.mem(idx.flip(1)[:, : t // 2])
        h = self.heads
        q = self.q(self.norm1(x)).view(b, t, h, -1).transpose(1, 2)
        k, v = (z.view(b, t // 2, h, -1).transpose(1, 2) for z in self.kv(m).chunk(2, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o(y)
        z = self.norm2(x)
        x = x + self.down(F.silu(self.gate(z)) * self.up(z))
        return self.head(x)


class ConvBnDeep(nn.Module):
    """Four conv + batch-norm stages (two strided), max-pooled shortcut, average pooling: the batch
    norm and conv backward through a deeper stack."""

    def __init__(self):
        super().__init__()
        chans = (3, 8, 16, 16, 32)
        self.convs = nn.ModuleList(nn.Conv2d(a, b, 3, stride=1 + (i % 2), padding=1, bias=False)
                                   for i, (a, b) in enumerate(zip(chans, chans[1:])))
        self.norms = nn.ModuleList(nn.BatchNorm2d(c) for c in chans[1:])
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        for conv, norm in zip(self.convs, self.norms):
            x = F.relu(norm(conv(x)))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class TemporalConv(nn.Module):
    """Causal dilated Conv1d stack over token embeddings (dilations 1, 2, 4), GELU residuals, a
    LayerNorm and a linear head: a temporal conv net."""

    def __init__(self, d=32):
        super().__init__()
        self.emb = nn.Embedding(64, d)
        self.convs = nn.ModuleList(nn.Conv1d(d, d, 3, dilation=r) for r in (1, 2, 4))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 64)

    def forward(self, idx):
        x = self.emb(idx).transpose(1, 2)
        for conv in self.convs:
            x = x + F.gelu(conv(F.pad(x, (2 * conv.dilation[0], 0))))
        return self.head(self.norm(x.transpose(1, 2)))


class CellLoop(nn.Module):
    """Two stacked recurrent cells stepped by hand: nn.LSTMCell fed by a linear projection, then a GRU
    cell written out with linear gates (reset gate inside the candidate)."""

    def __init__(self, d=24, hidden=32):
        super().__init__()
        self.emb, self.proj = nn.Embedding(64, d), nn.Linear(d, d)
        self.lstm = nn.LSTMCell(d, hidden)
        self.zr, self.cand_x = nn.Linear(2 * hidden, 2 * hidden), nn.Linear(hidden, hidden)
        self.cand_h = nn.Linear(hidden, hidden, bias=False)
        self.head, self.hidden = nn.Linear(hidden, 64), hidden

    def forward(self, idx):
        x = self.emb(idx)
        b = idx.shape[0]
        h1 = c1 = h2 = torch.zeros(b, self.hidden)
        outs = []
        for t in range(idx.shape[1]):
            h1, c1 = self.lstm(self.proj(x[:, t]), (h1, c1))
            z, r = torch.sigmoid(self.zr(torch.cat([h1, h2], dim=-1))).chunk(2, dim=-1)
            n = torch.tanh(self.cand_x(h1) + self.cand_h(r * h2))
            h2 = (1 - z) * n + z * h2
            outs.append(h2)
        return self.head(torch.stack(outs, dim=1))


def _rotate(x, cos, sin):
    """Rotary position embedding: pairs of features (first half, second half) rotated by position."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class PositionalAttention(nn.Module):
    """Two pre-RMSNorm causal attention blocks with the position in the scores, not the embedding:
    `rope` rotates q and k (rotary embeddings, scaled_dot_product_attention), `alibi` adds a per-head
    linear distance penalty to explicit scores (softmax by hand)."""

    def __init__(self, kind, d=32, heads=4, blocks=2, t=16):
        super().__init__()
        self.kind, self.heads = kind, heads
        self.emb = nn.Embedding(64, d)
        self.norms = nn.ModuleList(nn.RMSNorm(d) for _ in range(2 * blocks))
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d, bias=False) for _ in range(blocks))
        self.o = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(blocks))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
                                 for _ in range(blocks))
        self.head = nn.Linear(d, 64)
        half = d // heads // 2
        angle = torch.arange(t)[:, None] / (10000.0 ** (torch.arange(half) / half))
        self.register_buffer("cos", angle.cos(), persistent=False)
        self.register_buffer("sin", angle.sin(), persistent=False)
        slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1) / heads)
        dist = (torch.arange(t)[None, :] - torch.arange(t)[:, None]).clamp(max=0).float()
        self.register_buffer("bias", slopes[:, None, None] * dist, persistent=False)

    def forward(self, idx):
        b, t = idx.shape
        x = self.emb(idx)
        for i, (qkv, o, mlp) in enumerate(zip(self.qkv, self.o, self.mlp)):
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in qkv(self.norms[2 * i](x)).chunk(3, -1))
            if self.kind == "rope":
                q, k = _rotate(q, self.cos[:t], self.sin[:t]), _rotate(k, self.cos[:t], self.sin[:t])
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + self.bias[:, :t, :t]
                att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
                y = att.softmax(dim=-1) @ v
            x = x + o(y.transpose(1, 2).reshape(b, t, -1))
            x = x + mlp(self.norms[2 * i + 1](x))
        return self.head(x)


class DepthwiseSeparable(nn.Module):
    """MobileNet-style stages: a depthwise 3x3 conv (groups = channels) and a pointwise 1x1 conv, each
    with batch norm, ReLU6 and hardswish, one stride-2 stage, an inverted-residual add, average pooling."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        chans = ((16, 24, 2), (24, 24, 1), (24, 32, 1))
        self.dw = nn.ModuleList(nn.Conv2d(a, a, 3, stride=s, padding=1, groups=a, bias=False) for a, _, s in chans)
        self.dw_bn = nn.ModuleList(nn.BatchNorm2d(a) for a, _, _ in chans)
        self.pw = nn.ModuleList(nn.Conv2d(a, c, 1, bias=False) for a, c, _ in chans)
        self.pw_bn = nn.ModuleList(nn.BatchNorm2d(c) for _, c, _ in chans)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = F.hardswish(self.bn0(self.stem(x)))
        for dw, dw_bn, pw, pw_bn in zip(self.dw, self.dw_bn, self.pw, self.pw_bn):
            y = pw_bn(pw(F.relu6(dw_bn(dw(x)))))
            x = x + y if y.shape == x.shape else y
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Recommender(nn.Module):
    """A DLRM-like recommender: three sparse features pooled by nn.EmbeddingBag (sum, mean, max), a
    bottom MLP on dense features, pairwise dot-product interactions, a top MLP to one click logit."""

    def __init__(self, d=16):
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(100, d, mode=m) for m in ("sum", "mean", "max"))
        self.bottom = nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, d), nn.ReLU())
        self.top = nn.Sequential(nn.Linear(d + 6, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        dense, ids, offsets = x
        feats = [self.bottom(dense)] + [bag(i, offsets) for bag, i in zip(self.bags, ids)]
        z = torch.stack(feats, dim=1)
        inter = z @ z.transpose(1, 2)
        upper = torch.triu_indices(4, 4, 1)
        pairs = inter[:, upper[0], upper[1]]
        return self.top(torch.cat([feats[0], pairs], dim=1)).squeeze(1)


class SelectiveScan(nn.Module):
    """A Mamba-2-like selective state-space layer, scanned in chunks of 4 steps in a Python loop: an
    input-dependent step size (softplus) and B, C projections; inside a chunk the decays are a cumsum
    of log-decays and the chunk's states come from exp of their differences, the last state carried into
    the next chunk; a gated output (SiLU) in a pre-RMSNorm residual, twice."""

    def __init__(self, d=32, state=8, layers=2, chunk=4):
        super().__init__()
        self.emb, self.head, self.chunk = nn.Embedding(64, d), nn.Linear(d, 64), chunk
        self.norms = nn.ModuleList(nn.RMSNorm(d) for _ in range(layers))
        self.inp = nn.ModuleList(nn.Linear(d, 2 * d) for _ in range(layers))
        self.dt = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.bc = nn.ModuleList(nn.Linear(d, 2 * state, bias=False) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.log_a = nn.Parameter(torch.log(torch.linspace(0.5, 4.0, state)).repeat(layers, d, 1))

    def _scan(self, u, dt, bmat, cmat, log_a):
        b, t, d = u.shape
        decay = -dt[..., None] * log_a.exp()  # (b, t, d, n), log of each step's decay
        drive = (dt * u)[..., None] * bmat[:, :, None, :]
        h = torch.zeros(b, d, log_a.shape[-1])
        ys = []
        for s in range(0, t, self.chunk):
            cum = decay[:, s:s + self.chunk].cumsum(dim=1)
            k = cum.shape[1]
            causal = torch.ones(k, k, dtype=torch.bool).tril()[None, :, :, None, None]
            pair = (cum[:, :, None] - cum[:, None, :]).masked_fill(~causal, float("-inf")).exp()
            states = torch.einsum("btsdn,bsdn->btdn", pair, drive[:, s:s + self.chunk]) + cum.exp() * h[:, None]
            ys.append(torch.einsum("btdn,btn->btd", states, cmat[:, s:s + self.chunk]))
            h = states[:, -1]
        return torch.cat(ys, dim=1)

    def forward(self, idx):
        x = self.emb(idx)
        for i, (norm, inp, dt, bc, out) in enumerate(zip(self.norms, self.inp, self.dt, self.bc, self.out)):
            u, gate = inp(norm(x)).chunk(2, dim=-1)
            bmat, cmat = bc(u).chunk(2, dim=-1)
            y = self._scan(u, F.softplus(dt(u)), bmat, cmat, self.log_a[i])
            x = x + out(y * F.silu(gate))
        return self.head(x)


class UNet(nn.Module):
    """A two-level U-Net: conv + GroupNorm + SiLU encoder stages, a strided-conv downsampling, a
    transposed-conv upsampling, the encoder's maps concatenated onto the decoder's (skip
    connections), a 1x1 conv and average-pooled head."""

    def __init__(self):
        super().__init__()

        def stage(a, b):
            return nn.Sequential(nn.Conv2d(a, b, 3, padding=1), nn.GroupNorm(4, b), nn.SiLU())

        self.enc1, self.down1, self.enc2 = stage(3, 8), nn.Conv2d(8, 16, 2, stride=2), stage(16, 16)
        self.down2, self.mid = nn.Conv2d(16, 32, 2, stride=2), stage(32, 32)
        self.up2, self.dec2 = nn.ConvTranspose2d(32, 16, 2, stride=2), stage(32, 16)
        self.up1, self.dec1 = nn.ConvTranspose2d(16, 8, 2, stride=2), stage(16, 8)
        self.mix, self.head = nn.Conv2d(8, 8, 1), nn.Linear(8, 10)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.down1(e1))
        m = self.mid(self.down2(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(self.mix(d1).mean(dim=(2, 3)))


class TopKExperts(nn.Module):
    """A mixture-of-experts layer: four SwiGLU experts, each token sent to its top two by a router
    that reads the token embedding in fp32 with autocast off (selective precision, as Switch
    Transformer routes), so both runs route every token alike; tokens gathered per expert, the
    experts' outputs weighted by the renormalised router probabilities and index_add-ed back; a
    residual, a LayerNorm, a dense GELU MLP and a linear head after it."""

    def __init__(self, d=32, experts=4, hidden=48):
        super().__init__()
        self.emb, self.router = nn.Embedding(64, d), nn.Linear(d, experts, bias=False)
        self.gate = nn.ModuleList(nn.Linear(d, hidden, bias=False) for _ in range(experts))
        self.up = nn.ModuleList(nn.Linear(d, hidden, bias=False) for _ in range(experts))
        self.down = nn.ModuleList(nn.Linear(hidden, d, bias=False) for _ in range(experts))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 64)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, idx):
        x = self.emb(idx)
        b, t, d = x.shape
        flat = x.reshape(-1, d)
        with torch.autocast("cpu", enabled=False):
            weight, chosen = self.router(flat).softmax(dim=-1).topk(2, dim=-1)
        weight = weight / weight.sum(dim=-1, keepdim=True)
        mixed = torch.zeros_like(flat)
        for e, (gate, up, down) in enumerate(zip(self.gate, self.up, self.down)):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            xe = flat[token]
            ye = down(F.silu(gate(xe)) * up(xe))
            mixed = mixed.index_add(0, token, ye.float() * weight[token, slot, None])
        x = x + mixed.view(b, t, d)
        x = x + self.mlp(self.norm(x))
        return self.head(x)


class TinyVit(nn.Module):
    """A small vision transformer: a 2x2 patch-embedding conv (16 patches of an 8x8 image), a class
    token and learned positions, two pre-norm nn.TransformerEncoderLayer blocks (GELU), the class
    token's LayerNorm and a linear head."""

    def __init__(self, d=32):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 2, stride=2)
        self.cls, self.pos = nn.Parameter(torch.randn(1, 1, d) * 0.02), nn.Parameter(torch.randn(1, 17, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 10)

    def forward(self, x):
        p = self.patch(x).flatten(2).transpose(1, 2)
        z = torch.cat([self.cls.expand(p.shape[0], -1, -1), p], dim=1) + self.pos
        return self.head(self.norm(self.blocks(z)[:, 0]))


class NormConvs(nn.Module):
    """Conv stages normalised per sample: InstanceNorm2d (affine) then GroupNorm with two groups,
    LeakyReLU and a scaled residual, a strided conv, global max and mean pooling concatenated into
    the head."""

    def __init__(self):
        super().__init__()
        self.c1, self.n1 = nn.Conv2d(3, 12, 3, padding=1), nn.InstanceNorm2d(12, affine=True)
        self.c2, self.n2 = nn.Conv2d(12, 12, 3, padding=1), nn.GroupNorm(2, 12)
        self.c3, self.n3 = nn.Conv2d(12, 24, 3, stride=2, padding=1), nn.GroupNorm(3, 24)
        self.head = nn.Linear(48, 10)

    def forward(self, x):
        h = F.leaky_relu(self.n1(self.c1(x)), 0.1)
        h = h + 0.5 * F.leaky_relu(self.n2(self.c2(h)), 0.1)
        h = F.leaky_relu(self.n3(self.c3(h)), 0.1)
        return self.head(torch.cat([h.amax(dim=(2, 3)), h.mean(dim=(2, 3))], dim=1))


class PaddedPooling(nn.Module):
    """Variable-length sequences: positions past each sample's length are padding. A GELU Conv1d over
    the embeddings, a learned-query attention pool whose scores at padding are masked_fill-ed to -inf
    before the softmax, and a logsumexp pool of the same scores beside it; a linear head over both."""

    def __init__(self, d=32):
        super().__init__()
        self.emb, self.conv = nn.Embedding(64, d), nn.Conv1d(d, d, 3, padding=1)
        self.query, self.key = nn.Parameter(torch.randn(d) * 0.2), nn.Linear(d, d)
        self.head = nn.Linear(d + 1, 10)

    def forward(self, idx):
        lengths = 6 + idx[:, 0] % 10  # 6..15 real tokens per sample, the same in both runs
        pad = torch.arange(idx.shape[1])[None, :] >= lengths[:, None]
        h = F.gelu(self.conv(self.emb(idx).transpose(1, 2))).transpose(1, 2)
        scores = (self.key(h) @ self.query).masked_fill(pad, float("-inf"))
        pooled = (scores.softmax(dim=-1)[..., None] * h).sum(dim=1)
        return self.head(torch.cat([pooled, scores.logsumexp(dim=-1, keepdim=True)], dim=-1))


def _sequences(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    return torch.randint(0, 64, (4, 16), generator=gen), torch.randint(0, 10, (4,), generator=gen)


def _tokens(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    idx = torch.randint(0, 64, (2, 16), generator=gen)
    return idx, torch.randint(0, 64, (2, 16), generator=gen)


def _images(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    return torch.randn(4, 3, 8, 8, generator=gen), torch.randint(0, 10, (4,), generator=gen)


def _vectors(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    return torch.randn(8, 16, generator=gen), torch.randint(0, 10, (8,), generator=gen)


def _clicks(seed):
    """Dense features, three sparse id lists (two ids per sample, shared offsets) and click labels."""
    gen = torch.Generator().manual_seed(100 + seed)
    ids = [torch.randint(0, 100, (16,), generator=gen) for _ in range(3)]
    x = (torch.randn(8, 13, generator=gen), ids, torch.arange(0, 16, 2))
    return x, torch.randint(0, 2, (8,), generator=gen).float()


def _click_loss(model, x, y):
    return F.binary_cross_entropy_with_logits(model(x).float(), y)


def _sequence_loss(model, x, y):
    return F.cross_entropy(model(x).float().reshape(-1, 64), y.reshape(-1))


def _class_loss(model, x, y):
    return F.cross_entropy(model(x).float(), y)


# family -> (half, build(), batch(seed), loss(model, x, y))
FAMILIES = {
    "gpt": ("tuning", lambda: Gpt("view"), _tokens, _sequence_loss),
    "gpt_layout": ("tuning", lambda: Gpt("permute"), _tokens, _sequence_loss),
    "conv_bn": ("tuning", ConvBn, _images, _class_loss),
    "gru": ("tuning", Gru, _tokens, _sequence_loss),
    "mha": ("tuning", Mha, _tokens, _sequence_loss),
    "rms_residual": ("held out", RmsResidual, _vectors, _class_loss),
    "lstm": ("tuning", Lstm, _tokens, _sequence_loss),
    "lstm_layout": ("tuning", lambda: Lstm(time_major=True), _tokens, _sequence_loss),
    "cross_attn": ("held out", CrossAttention, _tokens, _sequence_loss),
    "conv_bn_deep": ("held out", ConvBnDeep, _images, _class_loss),
    "temporal_conv": ("held out", TemporalConv, _tokens, _sequence_loss),
    "cell_loop": ("tuning", CellLoop, _tokens, _sequence_loss),
    "rope_attn": ("held out", lambda: PositionalAttention("rope"), _tokens, _sequence_loss),
    "alibi_attn": ("held out", lambda: PositionalAttention("alibi"), _tokens, _sequence_loss),
    "dw_separable": ("held out", DepthwiseSeparable, _images, _class_loss),
    "recommender": ("held out", Recommender, _clicks, _click_loss),
    "gpt_fp16": ("held out", lambda: Gpt("view"), _tokens, _sequence_loss),
    "dw_separable_fp16": ("held out", DepthwiseSeparable, _images, _class_loss),
    "selective_scan": ("tuning", SelectiveScan, _tokens, _sequence_loss),
    "unet": ("held out", UNet, _images, _class_loss),
    "moe": ("held out", TopKExperts, _tokens, _sequence_loss),
    "vit": ("held out", TinyVit, _images, _class_loss),
    "norm_convs": ("held out", NormConvs, _images, _class_loss),
    "padded_pool": ("held out", PaddedPooling, _sequences, _class_loss),
}
# the target's autocast dtype where it is not bfloat16
AUTOCAST = {"gpt_fp16": torch.float16, "dw_separable_fp16": torch.float16}
# a layout-only rewrite's golden: the family it rewrites, in fp32
GOLDEN_OF = {"gpt_layout": "gpt", "lstm_layout": "lstm"}
SEEDS = (0, 1)


def dump_run(dump_path, family, *, task="statistics", level="mix", autocast=None, seed=0, golden_layout=False):
    """One SGD step of a family's model under a PrecisionDebugger writing dump_path/step0/rank0. The
    golden of a layout rewrite is the family it rewrites (`golden_layout`: `GOLDEN_OF`, in fp32), of the
    others the model itself in fp32. Returns dump_path as a string."""
    from msprobe.pytorch import PrecisionDebugger

    _, build, batch, loss_fn = FAMILIES[GOLDEN_OF.get(family, family) if golden_layout else family]
    torch.manual_seed(seed)
    net = build()
    x, y = batch(seed)
    plants.dumped_step(PrecisionDebugger(dump_path=str(dump_path), task=task, level=level), net, x, y, loss_fn,
                       autocast)
    return str(dump_path)

"""The models the overhead benchmarks train (PyTorch), so that every script measures the same workloads.

| model | shape | loss |
|---|---|---|
| `transformer` | 4 pre-LayerNorm blocks, d_model 256, 4 heads, MLP 4x with GELU, attention with `matmul`/`softmax`, sequence 128, batch 4, vocabulary 1000 | cross entropy |
| `mlp` | 512 -> 4 hidden layers of 2048 (ReLU) -> 512, batch 128 | MSE |
| `cnn` | 3 x (conv 3x3, BatchNorm, ReLU, maxpool 2) on 3x64x64, then linear to 10 classes, batch 16 | cross entropy |
| `gpt` | the accelerator workload: the transformer with d_model 1024, 8 blocks, 16 heads, sequence 512, batch 8, vocabulary 8192; bf16 autocast on CUDA | cross entropy |
| `llama` | untuned: a `transformers` Llama built from a config (4 layers, hidden 256, 4 heads, 2 KV heads, MLP 512, RMSNorm and rotary embeddings in Python, SDPA attention), sequence 128, batch 4, vocabulary 1000 | cross entropy |
| `gpt2` | untuned: a `transformers` GPT-2 built from a config (4 layers, n_embd 256, 4 heads, learned positions, LayerNorm, GELU, Conv1D projections, eager attention), sequence 128, batch 4, vocabulary 1000 | cross entropy |
| `opt` | untuned: a `transformers` OPT built from a config (4 layers, hidden 256, 4 heads, FFN 1024 with ReLU, learned positions, separate q/k/v projections, SDPA attention), sequence 128, batch 4, vocabulary 1000 | cross entropy |

`llama`, `gpt2` and `opt` are the untuned half (benchmarks/README.md says why and which of them a change
was since looked at): they run only when named and need `transformers` (the test extra).

`Transformer(...)` with other sizes is also the compiled model of compile_overhead.py and the dumped model
of acc_check_throughput.py. The MindSpore models live in ms_dump_overhead.py (its only user). Models
with planted bugs, which tests use, live under tests/.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("transformer", "mlp", "cnn", "gpt", "llama", "gpt2", "opt")
CPU_MODELS = ("transformer", "mlp", "cnn")
UNTUNED_MODELS = ("llama", "gpt2", "opt")


class Block(nn.Module):
    """Pre-LayerNorm transformer block; attention written with plain torch ops."""

    def __init__(self, d_model, n_heads, mlp_ratio=4):
        super().__init__()
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, mlp_ratio * d_model)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(mlp_ratio * d_model, d_model)

    def forward(self, x):
        b, s, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q = q.view(b, s, h, d // h).transpose(1, 2)
        k = k.view(b, s, h, d // h).transpose(1, 2)
        v = v.view(b, s, h, d // h).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // h)
        attn = torch.softmax(scores, dim=-1)
        y = torch.matmul(attn, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab=1000, d_model=256, n_heads=4, n_blocks=4, seq=128):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq, d_model))
        self.blocks = nn.ModuleList([Block(d_model, n_heads) for _ in range(n_blocks)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class MLP(nn.Module):
    def __init__(self, d_in=512, hidden=2048, n_hidden=4, d_out=512):
        super().__init__()
        layers, d = [], d_in
        for _ in range(n_hidden):
            layers += [nn.Linear(d, hidden), nn.ReLU()]
            d = hidden
        layers.append(nn.Linear(d, d_out))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self, n_classes=10):
        super().__init__()
        chans, layers, c_in = (16, 32, 64), [], 3
        for c in chans:
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(), nn.MaxPool2d(2)]
            c_in = c
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(64 * 8 * 8, n_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


def hf_llama(vocab=1000, hidden=256, layers=4, heads=4, kv_heads=2, intermediate=512, seq=128):
    """A `transformers` LlamaForCausalLM built from a config (nothing downloaded), SDPA attention."""
    from transformers import LlamaConfig, LlamaForCausalLM  # only this workload needs it

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=seq,
                      attn_implementation="sdpa")
    return LlamaForCausalLM(cfg)


def hf_gpt2(vocab=1000, hidden=256, layers=4, heads=4, seq=128):
    """A `transformers` GPT2LMHeadModel built from a config (nothing downloaded), eager attention."""
    from transformers import GPT2Config, GPT2LMHeadModel  # only this workload needs it

    cfg = GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=seq,
                     attn_implementation="eager")
    return GPT2LMHeadModel(cfg)


def hf_opt(vocab=1000, hidden=256, layers=4, heads=4, ffn=1024, seq=128):
    """A `transformers` OPTForCausalLM built from a config (nothing downloaded), SDPA attention."""
    from transformers import OPTConfig, OPTForCausalLM  # only this workload needs it

    cfg = OPTConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                    ffn_dim=ffn, max_position_embeddings=seq, word_embed_proj_dim=hidden, dropout=0.0,
                    attn_implementation="sdpa")
    return OPTForCausalLM(cfg)


# the untuned half's builders: each a causal language model trained on token ids
HF_MODELS = {"llama": hf_llama, "gpt2": hf_gpt2, "opt": hf_opt}


class Workload:
    """A model, its optimizer and one fixed batch; `train_step()` is forward + backward + SGD step.

    `gpt` is the accelerator workload (d_model 1024, 8 blocks, 16 heads, sequence 512, batch 8, vocabulary
    8192, bf16 autocast on CUDA): run it with --device cuda; `gpt_blocks` shortens it (tensor_L1 writes
    every activation: ~1 GB a block and step)."""

    def __init__(self, name, device="cpu", gpt_blocks=8):
        torch.manual_seed(0)
        self.name = name
        self.device = torch.device(device)
        self.autocast = False
        if name == "gpt":
            self.model = Transformer(vocab=8192, d_model=1024, n_heads=16, n_blocks=gpt_blocks, seq=512)
            self.x = torch.randint(0, 8192, (8, 512))
            self.y = torch.randint(0, 8192, (8, 512))
            self.loss_fn = lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
            self.autocast = self.device.type == "cuda"
        elif name == "transformer":
            self.model = Transformer()
            self.x = torch.randint(0, 1000, (4, 128))
            self.y = torch.randint(0, 1000, (4, 128))
            self.loss_fn = lambda out, y: F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        elif name in HF_MODELS:
            self.model = HF_MODELS[name]()
            self.x = torch.randint(0, 1000, (4, 128))
            self.y = torch.randint(0, 1000, (4, 128))
            self.loss_fn = lambda out, y: F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), y.reshape(-1))
        elif name == "mlp":
            self.model = MLP()
            self.x = torch.randn(128, 512)
            self.y = torch.randn(128, 512)
            self.loss_fn = F.mse_loss
        elif name == "cnn":
            self.model = CNN()
            self.x = torch.randn(16, 3, 64, 64)
            self.y = torch.randint(0, 10, (16,))
            self.loss_fn = F.cross_entropy
        else:
            raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
        self.model.to(self.device).train()
        self.x, self.y = self.x.to(self.device), self.y.to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)

    def train_step(self):
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            out = self.model(self.x)
        loss = self.loss_fn(out, self.y)
        loss.backward()
        self.opt.step()
        return loss

    def sync(self):
        """Wait for the device: a step's time is its device time too."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

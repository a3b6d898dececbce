"""Tiny Hugging Face models built from a config with random weights (nothing is downloaded), and one
dumped training step of them, for the real-training-setup tests."""

import torch

transformers = __import__("pytest").importorskip("transformers")

VOCAB, SEQ = 64, 8


def llama(attn="sdpa", seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                   use_cache=False, attn_implementation=attn)
    return transformers.LlamaForCausalLM(cfg)


def gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=16,
                                  use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


def tokens(seed=1, batch=2):
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(seed))


def dump_step(model, dump_path, level="mix", micro_batches=1, autocast=False):
    """One optimizer step of `micro_batches` forward/backward passes under a PrecisionDebugger; returns
    the rank dir and the losses."""
    from msprobe.pytorch import PrecisionDebugger
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(dump_path=str(dump_path), level=level)
    debugger.start(model if level != "L1" else None)
    losses = []
    for mb in range(micro_batches):
        ids = tokens(seed=1 + mb)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss / micro_batches
        loss.backward()
        losses.append(loss.item())
    opt.step()
    opt.zero_grad()
    debugger.stop()
    debugger.step()
    debugger.close()
    (rank_dir,) = list((dump_path / "step0").iterdir())
    return rank_dir, losses

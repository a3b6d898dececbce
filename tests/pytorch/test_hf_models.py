"""Hugging Face models as people train them: real module paths at L0/mix, the ops of SDPA, RMSNorm and
the rotary embedding at L1, eager vs SDPA attention, activation checkpointing (reentrant and not),
gradient accumulation and autocast (tests/pytorch/hf_models.py builds tiny models from configs)."""

import json

import pytest

torch = pytest.importorskip("torch")
hf = pytest.importorskip("hf_models")

from msprobe.core.diagnosis import diagnose  # noqa: E402
from msprobe.core.compare.engine import compare_dumps  # noqa: E402


def _data(rank_dir):
    with open(rank_dir / "dump.json") as f:
        return json.load(f)["data"]


def _construct(rank_dir):
    with open(rank_dir / "construct.json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def llama_dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    return {attn: hf.dump_step(hf.llama(attn), root / attn)[0] for attn in ("sdpa", "eager")}


def test_llama_mix_names_real_module_paths_and_records_attention_norm_and_rotary(llama_dumps):
    data, construct = _data(llama_dumps["sdpa"]), _construct(llama_dumps["sdpa"])
    for key in ("Module.model.layers.0.self_attn.q_proj.Linear.forward.0",
                "Module.model.layers.1.mlp.down_proj.Linear.forward.0",
                "Module.model.layers.0.input_layernorm.LlamaRMSNorm.forward.0",
                "Module.model.rotary_emb.LlamaRotaryEmbedding.forward.0",
                "Functional.scaled_dot_product_attention.0.forward",
                "Functional.scaled_dot_product_attention.1.backward",
                "Module.model.layers.0.self_attn.q_proj.Linear.parameters_grad.0"):
        assert key in data, key
    # RMSNorm's ops and the rotary embedding's cos/sin sit under their modules
    norm = "Module.model.layers.0.input_layernorm.LlamaRMSNorm.forward.0"
    assert {k.split(".")[1] for k, parent in construct.items() if parent == norm} >= {"pow", "mean", "rsqrt"}
    rotary = "Module.model.rotary_emb.LlamaRotaryEmbedding.forward.0"
    assert {k.split(".")[1] for k, parent in construct.items() if parent == rotary} >= {"cos", "sin"}


def test_llama_l1_records_the_same_ops(tmp_path):
    data = _data(hf.dump_step(hf.llama(), tmp_path, level="L1")[0])
    names = {k.split(".")[1] for k in data}
    assert {"scaled_dot_product_attention", "rsqrt", "cos", "sin", "embedding", "cross_entropy"} <= names
    assert not any(k.startswith("Module.") for k in data)


def test_llama_eager_vs_sdpa_agrees_within_float_noise(llama_dumps):
    """The two attention implementations call other ops around attention (eager builds its mask with
    more slicing): compare aligns the call sequences, and in float32 the runs agree."""
    d = diagnose(compare_dumps(str(llama_dumps["sdpa"]), str(llama_dumps["eager"]), progress=False))
    assert d["divergence"] is False, d["verdict"]


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated")
@pytest.mark.parametrize("how", ["hf", "reentrant"])
def test_activation_checkpointing_adds_no_forward_calls_and_no_divergence(how, tmp_path):
    plain_dir, plain_losses = hf.dump_step(hf.gpt2(), tmp_path / "plain")
    model = hf.gpt2()
    if how == "hf":  # transformers' default: torch.utils.checkpoint without reentrance
        model.gradient_checkpointing_enable()
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    ckpt_dir, ckpt_losses = hf.dump_step(model, tmp_path / "ckpt")
    assert ckpt_losses == plain_losses
    plain, ckpt = _data(plain_dir), _data(ckpt_dir)
    forward = [k for k in plain if "forward" in k]
    assert [k for k in ckpt if "forward" in k] == forward  # same calls, same numbering, same order
    if how == "hf":  # the first forward's graph is kept: every backward record is there too
        assert list(ckpt) == list(plain)
    d = diagnose(compare_dumps(str(ckpt_dir), str(plain_dir), progress=False))
    assert d["divergence"] is False, d["verdict"]


def test_gradient_accumulation_under_autocast_pairs_micro_batches_in_order(tmp_path):
    golden_dir, _ = hf.dump_step(hf.gpt2(), tmp_path / "golden", micro_batches=2, autocast=True)
    data = _data(golden_dir)
    # each micro-batch's calls are distinct records, the second numbered after the first
    assert "Module.transformer.h.0.attn.GPT2Attention.forward.1" in data
    assert "Module.transformer.h.0.attn.GPT2Attention.backward.1" in data
    lm_head = [k for k in data if k.startswith("Module.lm_head.Linear.forward.")]
    assert lm_head == ["Module.lm_head.Linear.forward.0", "Module.lm_head.Linear.forward.1"]
    assert data["Functional.linear.0.forward"]["output"][0]["dtype"] == "torch.bfloat16"  # autocast
    # the second micro-batch's data scaled in the target: compare pairs micro-batch with micro-batch and
    # names the second one's first call, not the first's
    target = hf.gpt2()
    first = target.transformer.h[0]
    calls = []

    def scale_second(module, args):
        calls.append(1)
        return (args[0] * 1.01,) + args[1:] if len(calls) == 2 else None
    first.register_forward_pre_hook(scale_second)
    target_dir, _ = hf.dump_step(target, tmp_path / "target", micro_batches=2, autocast=True)
    d = diagnose(compare_dumps(str(target_dir), str(golden_dir), progress=False))
    assert d["divergence"] is True
    top = d["suspects"][0]
    # 5 layer norms a micro-batch (ln_1, ln_2 of two blocks, ln_f): .5 is the second one's first, in h.0
    assert top["api"] == "Functional.layer_norm.5.forward", top
    first_layer = [k for k in data if k.startswith("Module.transformer.h.0.GPT2Block.forward.")]
    assert first_layer == ["Module.transformer.h.0.GPT2Block.forward.0", "Module.transformer.h.0.GPT2Block.forward.1"]

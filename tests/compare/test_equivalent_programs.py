"""No false alarms on equivalent programs: two runs that compute the same values, reached differently,
are no divergence. Real dumps: the same MLP in MindSpore and PyTorch (integer labels of different
widths), an attention written with other views and layouts, and extra casts and copies."""

import json
import os
import subprocess
import sys

import pytest

from private_modules import load_private

torch = pytest.importorskip("torch")

from msprobe.core.compare import compare_dumps  # noqa: E402
from msprobe.core.diagnosis import diagnose, format_diagnosis  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402

nn, F = torch.nn, torch.nn.functional


def _dump(path, net, x, loss_fn, level="mix"):
    debugger = PrecisionDebugger(dump_path=str(path), task="statistics", level=level)
    debugger.start(net, rank_id=0)
    out = net(x)
    loss_fn(out).backward()
    debugger.stop()
    debugger.step()
    debugger.close()
    return out.detach() if isinstance(out, torch.Tensor) else out


class Attention(nn.Module):
    """Two heads over a fused qkv projection; `layout` picks how heads are split and merged again."""

    def __init__(self, layout):
        super().__init__()
        self.qkv, self.proj, self.layout = nn.Linear(16, 48), nn.Linear(16, 16), layout

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.layout == "view":
            q, k, v = (z.view(b, t, 2, d // 2).transpose(1, 2) for z in (q, k, v))
        else:
            q, k, v = (z.reshape(b, t, 2, d // 2).permute(0, 2, 1, 3).contiguous() for z in (q, k, v))
        a = torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1) @ v
        if self.layout == "view":
            y = a.transpose(1, 2).reshape(b, t, d)
        else:
            y = a.permute(0, 2, 1, 3).contiguous().view(b, t, d)
        return self.proj(y)


class AttentionNet(nn.Module):
    def __init__(self, layout, extra_casts=False):
        super().__init__()
        self.attn, self.head, self.extra_casts = Attention(layout), nn.Linear(16, 4), extra_casts

    def forward(self, x):
        h = self.attn(x)
        if self.extra_casts:  # a cast and a copy that change nothing
            h = h.float().contiguous()
        return self.head(h)


def _attention_run(path, layout, extra_casts=False, level="mix"):
    torch.manual_seed(0)
    net = AttentionNet(layout, extra_casts)
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(1))
    return _dump(path, net, x, lambda out: out.square().mean(), level)


@pytest.mark.parametrize("level", ["mix", "L1"])
def test_layout_only_rewrite_is_no_divergence(tmp_path, level):
    """view/transpose against reshape/permute/contiguous: the same values, other call names and indices.
    The runs call an API both make a different number of times, so compare aligns the call sequences;
    the views one side lacks are harmless structure, not suspects, and the dumps are not "mostly
    unmatched"."""
    golden = _attention_run(tmp_path / "g", "view", level=level)
    target = _attention_run(tmp_path / "t", "permute", level=level)
    assert torch.equal(golden, target)  # the premise: the outputs are bitwise equal
    results = compare_dumps(str(tmp_path / "t"), str(tmp_path / "g"), progress=False)
    d = diagnose(results)
    assert d["divergence"] is False and d["suspects"] == [], format_diagnosis(d)
    assert d["verdict"].startswith("no divergence:")
    notes = d["ranks"][0]["structure"]
    assert notes["extra_harmless"]["count"] >= 6
    # known limit of the alignment: backward records beside the rewritten layout may go unpaired; every
    # forward call pairs
    assert all(".backward" in k or ".parameters_grad" in k for k in notes["extra_other"].get("examples", []))
    labels = results[0].table.set_index("NPU Name")["Diagnosis"]
    assert labels["Functional.linear.1.forward.output.0"] == "agrees"
    text = format_diagnosis(d)
    assert "extra cast/view/copy call(s) in the target whose values downstream agree (harmless)" in text


def test_extra_cast_and_copy_are_structure_notes(tmp_path):
    _attention_run(tmp_path / "g", "view")
    _attention_run(tmp_path / "t", "view", extra_casts=True)
    d = diagnose(compare_dumps(str(tmp_path / "t"), str(tmp_path / "g"), progress=False))
    assert d["divergence"] is False and d["suspects"] == [], format_diagnosis(d)
    harmless = d["ranks"][0]["structure"]["extra_harmless"]
    assert {"Tensor.float.0.forward", "Tensor.contiguous.0.forward"} <= set(harmless["examples"])


mlp_twins = load_private("msprobe_test_mlp_twins", os.path.join(os.path.dirname(__file__), "mlp_twins.py"))


@pytest.fixture(scope="module")
def ms_and_pt_dumps(tmp_path_factory):
    """The same MLP and batch trained one step with cross entropy: MindSpore with Int32 labels (its
    cross entropy refuses int64), PyTorch with int64 labels."""
    mindspore = pytest.importorskip("mindspore")

    from msprobe.mindspore import PrecisionDebugger as MsDebugger

    root = tmp_path_factory.mktemp("ms_pt_ce")
    ms_net, pt_net, models = mlp_twins.twins()
    x, _ = models.make_data("mlp")
    labels = (abs(x[:, 0] * 10).astype("int64") % 4)

    ms_dbg = MsDebugger(dump_path=str(root / "ms"), level="mix")
    opt = mindspore.nn.SGD(ms_net.trainable_params(), learning_rate=0.05)
    cross_entropy = mindspore.nn.CrossEntropyLoss()

    def loss_fn(xb, yb):
        return cross_entropy(ms_net(xb), yb)

    grad_fn = mindspore.value_and_grad(loss_fn, None, opt.parameters)
    ms_dbg.start(ms_net)
    ms_loss, grads = grad_fn(mindspore.Tensor(x), mindspore.Tensor(labels.astype("int32")))
    opt(grads)
    ms_dbg.stop()
    ms_dbg.step()
    ms_dbg.close()

    pt_dbg = PrecisionDebugger(dump_path=str(root / "pt"), level="mix")
    pt_opt = torch.optim.SGD(pt_net.parameters(), lr=0.05)
    pt_dbg.start(pt_net)
    pt_loss = F.cross_entropy(pt_net(torch.from_numpy(x)), torch.from_numpy(labels))
    pt_loss.backward()
    pt_opt.step()
    pt_dbg.stop()
    pt_dbg.step()
    pt_dbg.close()
    assert abs(float(ms_loss.asnumpy()) - pt_loss.item()) < 1e-5  # the same computation
    return str(root / "ms"), str(root / "pt")


def test_int32_and_int64_labels_with_equal_values_agree(ms_and_pt_dumps):
    ms_dump, pt_dump = ms_and_pt_dumps
    results = compare_dumps(ms_dump, pt_dump, progress=False)
    d = diagnose(results)
    assert d["divergence"] is False, format_diagnosis(d)
    table = results[0].table
    labels = table[table["NPU Name"].str.contains("cross_entropy.0.forward.input.1")]
    assert len(labels) == 1
    label = labels.iloc[0]
    assert (label["NPU Dtype"], label["Bench Dtype"]) == ("Int32", "torch.int64")
    assert label["Diagnosis"] == "agrees"


def test_cli_does_not_fail_on_the_cross_framework_pair(ms_and_pt_dumps, tmp_path):
    ms_dump, pt_dump = ms_and_pt_dumps
    proc = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "compare", "-tp", ms_dump, "-gp", pt_dump,
                           "-o", str(tmp_path), "--no-progress", "--fail-on-divergence"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "diagnosis.json").read_text())["divergence"] is False


def _gpt2_run(path, checkpointing):
    """A two-layer HF GPT-2 built from its config, one backward; HF turns `use_cache` off under gradient
    checkpointing, and nothing else changes."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    return _dump(path, model, ids, lambda out: out.logits.square().mean()).logits


def test_an_argument_that_changes_no_value_is_a_structure_note(tmp_path):
    """use_cache False against True, every value equal: no divergence, the argument named in a note and
    its rows marginal (not introduces)."""
    golden = _gpt2_run(tmp_path / "g", checkpointing=False)
    target = _gpt2_run(tmp_path / "t", checkpointing=True)
    assert torch.equal(golden, target)  # the premise
    results = compare_dumps(str(tmp_path / "t"), str(tmp_path / "g"), progress=False)
    d = diagnose(results)
    assert d["divergence"] is False and d["suspects"] == [], format_diagnosis(d)
    assert "use_cache differs (False vs golden True)" in d["verdict"]
    assert d["verdict"].endswith("no value is affected")
    [note] = d["ranks"][0]["structure"]["idle_arguments"]
    assert note["argument"] == "use_cache (False vs golden True)" and note["count"] >= 2
    table = results[0].table
    rows = table[table["NPU Name"].str.endswith(".input.use_cache")]
    assert (rows["Diagnosis"] == "marginal").sum() == note["count"]  # the others are equal (GPT2Model's)
    assert "introduces" not in set(table["Diagnosis"])
    assert "use_cache differs (False vs golden True) at" in format_diagnosis(d)


class FlagNet(nn.Module):
    """A block called with a flag that changes no value, then a head."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x, trace=False):
            return torch.tanh(self.fc(x))

    def __init__(self, trace):
        super().__init__()
        self.block, self.head, self.trace = FlagNet.Block(), nn.Linear(8, 2), trace

    def forward(self, x):
        return self.head(self.block(x, trace=self.trace))


def _flag_run(path, trace, perturbed=False):
    torch.manual_seed(0)
    net = FlagNet(trace)
    if perturbed:
        with torch.no_grad():
            net.head.weight[0, 3] += 0.5
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    return _dump(path, net, x, lambda out: out.square().mean())


def test_a_changed_argument_is_listed_only_when_values_differ(tmp_path):
    """The same flag against a run whose head weight differs as well: the weight introduces the error; the
    flag is listed after it as marginal. Without the perturbed weight the flag is a note only."""
    _flag_run(tmp_path / "g", trace=False)
    _flag_run(tmp_path / "t", trace=True)
    d = diagnose(compare_dumps(str(tmp_path / "t"), str(tmp_path / "g"), progress=False))
    assert d["divergence"] is False and d["suspects"] == [], format_diagnosis(d)
    assert d["verdict"].endswith("trace differs (True vs golden False) at 1 call; no value is affected")
    _flag_run(tmp_path / "p", trace=True, perturbed=True)
    d = diagnose(compare_dumps(str(tmp_path / "p"), str(tmp_path / "g"), progress=False))
    assert d["divergence"] is True, format_diagnosis(d)
    assert (d["suspects"][0]["kind"], d["suspects"][0]["tier"]) == ("parameter", "strong")
    flag = next(s for s in d["suspects"] if s["kind"] == "argument")
    assert flag["tier"] == "weak" and flag["api"] == "Module.block.Block.forward.0"
    assert "values elsewhere in this step differ" in flag["reason"]

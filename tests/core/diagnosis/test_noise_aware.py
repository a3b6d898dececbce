"""Noise-aware verdicts for the comparison people make most: a whole-model bf16 (or fp16) autocast target
against an fp32 golden differs everywhere, yet only a planted bug is a divergence. A subset of the suite
in tests/compare/autocast_plants.py (benchmarks/bf16_diagnosis.py runs all of it and the baselines)."""

import os
import subprocess
import sys

import pytest

from private_modules import load_private

torch = pytest.importorskip("torch")

from msprobe.core.compare import compare_dumps  # noqa: E402
from msprobe.core.diagnosis import diagnose, format_diagnosis  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
plants = load_private("msprobe_bench_autocast_plants", os.path.join(TESTS, "compare", "autocast_plants.py"))


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """dump(name, task, level) -> dump path of a plant or control (cached), and the fp32 goldens."""
    root = tmp_path_factory.mktemp("autocast")
    cache = {}

    def dump(name, task="statistics", level="mix"):
        if (name, task, level) not in cache:
            seed, dtype = plants.CONTROLS.get(name, (0, torch.bfloat16))
            plant = None if name in plants.CONTROLS or name == "golden" else name
            cache[(name, task, level)] = plants.dump_run(root / f"{name}_{task}_{level}", plant, task=task,
                                                         level=level, seed=seed,
                                                         autocast=None if name == "golden" else dtype)
        return cache[(name, task, level)]
    return dump


def _diagnose(suite, name, task="statistics", level="mix", **kw):
    results = compare_dumps(suite(name, task, level), suite("golden", task, level), progress=False)
    return diagnose(results, **kw), results


@pytest.mark.parametrize("name", ["none", "none_fp16"])
def test_autocast_alone_is_no_divergence_beyond_its_precision(suite, name):
    d, results = _diagnose(suite, name)
    dtype = "bfloat16" if name == "none" else "float16"
    assert d["divergence"] is False and d["suspects"] == [], format_diagnosis(d)
    assert d["precision"]["working"] == dtype and d["precision"]["inferred"] is True
    assert d["verdict"].startswith(f"no divergence beyond {dtype} precision")
    table = results[0].table.set_index("NPU Name")
    # msProbe's Result calls every autocast row an error (dtypes differ); the Diagnosis column does not
    assert (table["Result"] == "error").sum() > 50
    assert not table["Diagnosis"].isin(["introduces", "marginal"]).any()
    first = table.loc["Functional.linear.0.forward.output.0"]  # the first op autocast runs in low precision
    assert (first["NPU Dtype"], first["Bench Dtype"], first["Diagnosis"]) == (f"torch.{dtype}", "torch.float32",
                                                                              "rounding")
    assert table.loc["Functional.layer_norm.1.forward.output.0", "Diagnosis"] == "inherits"


@pytest.mark.parametrize("name, task, level, kind", [
    ("fp8_b0_fc1", "statistics", "mix", "introduced"),    # a cast below autocast's precision: error beyond bf16
    ("weight_b1_fc2", "statistics", "L1", "parameter"),   # an L1 weight argument differing by 0.1% of its norm
    ("fp16_exp_b0", "statistics", "mix", "overflow"),
    ("scale_b1", "tensor", "L1", "argument"),
])
def test_a_planted_bug_is_found_inside_autocast_noise(suite, name, task, level, kind):
    d, results = _diagnose(suite, name, task, level)
    top = d["suspects"][0]
    assert d["divergence"] is True and plants.hit(name, top), format_diagnosis(d)
    assert top["kind"] == kind
    assert all(s["tier"] != "strong" for s in d["suspects"][1:]) or len(d["suspects"]) == 1, format_diagnosis(d)
    labels = results[0].table.set_index("NPU Name")["Diagnosis"]
    assert "introduces" in {labels[r["name"]] for r in top["inputs"] + top["outputs"]}


def test_a_given_precision_replaces_the_inferred_one(suite, tmp_path):
    """Told the target may only round like fp32, autocast's first bf16 op is where error enters."""
    d, _ = _diagnose(suite, "none", precision="float32")
    assert d["precision"] == {"working": "float32", "unit_roundoff": 2 ** -24, "inferred": False}
    assert d["divergence"] is True and d["suspects"][0]["api"] == "Functional.linear.0.forward"
    proc = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "compare", "-tp", suite("none"), "-gp",
                           suite("golden"), "-o", str(tmp_path), "--precision", "fp64"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--precision: invalid choice: 'fp64'" in proc.stderr


negatives = load_private("msprobe_bench_bf16_negatives", os.path.join(TESTS, "compare", "bf16_negatives.py"))


@pytest.mark.parametrize("family, task, level, dtype", [
    ("gpt_layout", "statistics", "mix", "bfloat16"),  # heads split with reshape/permute against view/transpose:
    ("gpt_layout", "tensor", "mix", "bfloat16"),      # the backward pairing misses calls golden makes too
    ("conv_bn", "tensor", "L1", "bfloat16"),          # relu's backward: rounding flips single elements at zero
    # autocast runs nn.GRU in bf16 and returns float32, and only the head shows bf16 rows: the working
    # precision is known from `linear` lowering its float32 inputs, and the GRU rounds once per time step
    ("gru", "statistics", "L1", "bfloat16"),
    ("gru", "statistics", "mix", "float16"),
    ("mha", "tensor", "mix", "bfloat16"),             # nn.ReLU's module backward switches like relu's
    # at L1 no module record anchors the pairing: two reshape + permute against transpose + contiguous +
    # view must not slide the alignment (it had paired the optimizer's add_ calls one off)
    ("gpt_layout", "statistics", "L1", "float32"),
    ("gpt_layout", "tensor", "L1", "bfloat16"),
    # autocast casts a weight once per region and every time step's linear reads that cast: each
    # step's backward records its own share of the weight's gradient, not the sum over all steps
    ("lstm", "statistics", "mix", "bfloat16"),
    # the time-major rewrite's transpose backward (golden has none) hands on a gradient autograd summed
    # over the time steps: it carries what unrecorded work carries, as a gradient read directly does
    ("lstm_layout", "tensor", "L1", "bfloat16"),
    # a chunked scan masks its pairwise decays to -inf above the diagonal, every finite one <= 0: golden's
    # max is 0 and its min -inf, so the range its MaxAbsErr is measured against is unknown, not zero
    ("selective_scan", "tensor", "L1", "bfloat16"),
])
def test_clean_models_of_other_shapes_are_no_divergence(tmp_path, family, task, level, dtype):
    golden = negatives.dump_run(tmp_path / "g", family, task=task, level=level, golden_layout=True)
    autocast = None if dtype == "float32" else getattr(torch, dtype)
    target = negatives.dump_run(tmp_path / "t", family, task=task, level=level, autocast=autocast)
    d = diagnose(compare_dumps(target, golden, progress=False))
    assert d["divergence"] is False and d["suspects"] == [], format_diagnosis(d)
    assert d["verdict"].startswith("no divergence:" if autocast is None else f"no divergence beyond {dtype} precision")


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_a_split_gradient_is_measured_against_its_piece(tmp_path, level):
    # a hand-stepped GRU cell reads cat([h1, h2]): cat's backward hands on two halves of a bf16-rounded
    # gradient; a half's min is another element than the whole's (0.013 of its range against the
    # whole's 0.0035), which the whole's statistics never saw: rounding carried, not an amplification
    golden = negatives.dump_run(tmp_path / "g", "cell_loop", task="statistics", level=level, seed=1)
    target = negatives.dump_run(tmp_path / "t", "cell_loop", task="statistics", level=level, seed=1,
                                autocast=torch.bfloat16)
    d = diagnose(compare_dumps(target, golden, progress=False))
    assert d["divergence"] is False and d["suspects"] == [], format_diagnosis(d)
    assert d["verdict"].startswith("no divergence beyond bfloat16 precision")


class _Window(torch.nn.Module):
    """Token features, then a window of 8 of the 16 positions (`start`), a linear head: a slice whose
    window is wrong in the target is a real difference inside the bf16 noise."""

    def __init__(self, start):
        super().__init__()
        self.emb, self.mix, self.head = torch.nn.Embedding(64, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 64)
        self.start = start

    def forward(self, idx):
        return self.head(self.mix(self.emb(idx))[:, self.start:self.start + 8])


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_a_wrong_slice_is_still_found_inside_bf16_noise(tmp_path, task):
    # the slice's bounds differ, an argument change that is a divergence only while its output differs
    # beyond what its input and the piece's allowance (its size against the whole's, in statistics mode
    # 10x on top) explain: the allowance must not hide the other half of the sequence
    from msprobe.pytorch import PrecisionDebugger

    def run(path, start, autocast):
        torch.manual_seed(0)
        net = _Window(start)
        idx, y = negatives._tokens(0)
        plants.dumped_step(PrecisionDebugger(dump_path=str(path), task=task, level="L1"), net, idx, y[:, :8],
                           negatives._sequence_loss, autocast)
        return str(path)

    d = diagnose(compare_dumps(run(tmp_path / "t", 8, torch.bfloat16), run(tmp_path / "g", 0, None),
                               progress=False))
    assert d["divergence"] is True, format_diagnosis(d)
    assert d["suspects"][0]["api"] == "Tensor.__getitem__.0.forward", format_diagnosis(d)

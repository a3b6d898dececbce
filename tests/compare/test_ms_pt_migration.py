"""The migration compare with no mapping flags: idiomatic MindSpore twins (nn.Dense, nn.LayerNorm,
nn.Conv2d, nn.BatchNorm2d, ops.softmax, value_and_grad + nn.SGD) against their PyTorch originals
(tests/compare/ms_pt_twins.py, the "vision" family), real MindSpore PyNative and real PyTorch dumps.
The held-out family and all eight plants run in benchmarks/ms_pt_migration.py."""

import os

import numpy as np
import pytest

from private_modules import load_private

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
torch = pytest.importorskip("torch")

from msprobe.core.compare import compare_dumps  # noqa: E402
from msprobe.core.compare.matching import INSIDE_FUSED  # noqa: E402
from msprobe.core.diagnosis import diagnose, format_diagnosis  # noqa: E402
from msprobe.core.diagnosis.thresholds import VALUE_PRESERVING_APIS  # noqa: E402

twins = load_private("msprobe_test_ms_pt_twins", os.path.join(os.path.dirname(__file__), "ms_pt_twins.py"))
FAMILY = "vision"


def _dump(root, level, plant):
    from msprobe.mindspore import PrecisionDebugger as MsDebugger
    from msprobe.pytorch import PrecisionDebugger as PtDebugger
    x, y = twins.make_data(FAMILY)
    pt_dir = root / f"pt-{level}"
    if not pt_dir.exists():
        pt_net = twins.build_pt(FAMILY, twins.build_ms(FAMILY))
        debugger = PtDebugger(dump_path=str(pt_dir), task="statistics", level=level)
        twins.train_pt(FAMILY, pt_net, x, y, debugger)
        debugger.close()
    ms_dir = root / f"ms-{level}-{plant}"
    debugger = MsDebugger(dump_path=str(ms_dir), task="statistics", level=level)
    twins.train_ms(FAMILY, twins.build_ms(FAMILY, plant), x, y, plant, debugger)
    debugger.close()
    return str(ms_dir), str(pt_dir)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("ms_pt")
    runs = {}
    for level, plant in (("mix", None), ("L1", None), ("mix", "conv_weight"), ("mix", "other_ops"),
                         ("mix", "weight_decay"), ("mix", "bprop_scale")):
        runs[(level, plant)] = compare_dumps(*_dump(root, level, plant), progress=False)
    return runs


def _table(results):
    (res,) = results
    return res, dict(zip(res.table["NPU Name"], res.table["Bench Name"]))


def test_standard_cells_meet_their_modules_and_parameters_their_names(dumps):
    res, pairs = _table(dumps[("mix", None)])
    assert (res.target_framework, res.golden_framework) == ("mindspore", "pytorch")
    # Cell class names and parameter names as PyTorch has them
    assert pairs["Cell.block.q.Dense.forward.0.output.0"] == "Module.block.q.Linear.forward.0.output.0"
    assert pairs["Cell.block.norm1.LayerNorm.forward.0.parameters.gamma"] == \
        "Module.block.norm1.LayerNorm.forward.0.parameters.weight"
    assert pairs["Cell.bn.BatchNorm2d.parameters_grad.0.beta"] == "Module.bn.BatchNorm2d.parameters_grad.0.bias"
    assert pairs["Cell.head.Dense.parameters_grad.0.weight"] == "Module.head.Linear.parameters_grad.0.weight"
    # nn.Dense's MatMul + BiasAdd are one F.linear: weight, bias and output pair, the product in between
    # has no counterpart
    assert pairs["Primitive.matmul.MatMul.6.forward.input.1"] == "Functional.linear.6.forward.input.1"
    assert pairs["Primitive.bias_add.BiasAdd.7.forward.input.1"] == "Functional.linear.6.forward.input.2"
    assert pairs["Primitive.bias_add.BiasAdd.7.forward.output.0"] == "Functional.linear.6.forward.output.0"
    assert pairs["Primitive.matmul.MatMul.6.backward.output.1"] == "Functional.linear.6.backward.output.1"
    inside = res.table["NPU Name"][res.rows.gidx == INSIDE_FUSED].tolist()
    assert "Primitive.matmul.MatMul.6.forward.output.0" in inside
    # the primitives of nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d and nn.LayerNorm, ops.softmax
    assert pairs["Primitive.conv2d.Conv2D.0.forward.input.1"] == "Functional.conv2d.0.forward.input.1"
    assert pairs["Primitive.bn_train.BatchNorm.0.forward.input.1"] == "Functional.batch_norm.0.forward.input.weight"
    assert pairs["Primitive.bn_train.BatchNorm.0.backward.output.1"] == "Functional.batch_norm.0.backward.output.3"
    assert pairs["Primitive.relu.ReLU.0.forward.output.0"] == "Functional.relu.0.forward.output.0"
    assert pairs["Primitive.max_pool.MaxPool.0.forward.output.0"] == "Functional.max_pool2d.0.forward.output.0"
    assert pairs["Primitive.layer_norm.LayerNorm.1.backward.output.0"] == "Functional.layer_norm.1.backward.output.0"
    assert pairs["Tensor.astype.2.backward.output.0"] == "Functional.layer_norm.1.backward.output.1"  # gamma
    assert pairs["Functional.softmax.0.forward.input.axis"] == "Functional.softmax.0.forward.input.dim"


@pytest.mark.parametrize("level", ["mix", "L1"])
def test_target_values_find_their_partner(dumps, level):
    """Of the values that have a counterpart (not inside a fused call, not layout calls written
    differently on purpose), nearly all pair: the optimizer's updates too."""
    res, _ = _table(dumps[(level, None)])
    keys = res.rows.target["key"].astype(str)
    api = keys.str.rsplit(".", n=2).str[0].str.rsplit(".", n=1).str[-1]
    gidx = res.rows.gidx
    countable = (gidx != INSIDE_FUSED)
    countable &= ~((gidx < 0) & api.isin(VALUE_PRESERVING_APIS).to_numpy())
    share = float((gidx[countable] >= 0).mean())
    assert share >= 0.97, res.table[countable & (gidx < 0)]["NPU Name"].tolist()


@pytest.mark.parametrize("level", ["mix", "L1"])
def test_identical_twins_show_no_divergence(dumps, level):
    d = diagnose(dumps[(level, None)])
    assert d["divergence"] is False, format_diagnosis(d)
    assert d["mostly_unmatched"] is False


def test_other_ops_shift_nothing(dumps):
    """ops.transpose with a full permutation where the twin calls swapaxes: the calls after it still pair
    (alignment for a MindSpore target) and nothing diverges."""
    d = diagnose(dumps[("mix", "other_ops")])
    assert d["divergence"] is False, format_diagnosis(d)
    _, pairs = _table(dumps[("mix", "other_ops")])
    assert pairs["Functional.softmax.0.forward.output.0"] == "Functional.softmax.0.forward.output.0"
    assert pairs["Functional.matmul.1.forward.output.0"] == "Torch.matmul.1.forward.output.0"


def test_perturbed_conv_weight_is_named_first(dumps):
    d = diagnose(dumps[("mix", "conv_weight")])
    top = d["suspects"][0]
    assert top["api"] == "Primitive.conv2d.Conv2D.0.forward" and top["kind"] == "parameter", format_diagnosis(d)
    assert top["module_path"][-1] == "Cell.conv.Conv2d.forward.0"


def test_losses_of_the_twins_agree():
    """The premise of the suite: the same weights give the same loss in both frameworks."""
    x, y = twins.make_data(FAMILY)
    ms_net = twins.build_ms(FAMILY)
    pt_net = twins.build_pt(FAMILY, ms_net)
    a = twins.train_ms(FAMILY, ms_net, x, y, steps=2)
    b = twins.train_pt(FAMILY, pt_net, x, y, steps=2)
    assert np.allclose(a, b, rtol=1e-5), (a, b)


def test_optimizer_updates_pair_by_parameter_name(dumps):
    """Both frameworks record the SGD step per parameter (before, gradient, after); MindSpore's names
    (gamma, moving statistics aside) meet PyTorch's, and the record holds the update SGD made."""
    res, pairs = _table(dumps[("mix", None)])
    assert pairs["Optimizer.SGD.block.norm1.gamma.0.forward.output.0"] == \
        "Optimizer.SGD.block.norm1.weight.0.forward.output.0"
    assert pairs["Optimizer.SGD.head.weight.0.forward.input.1"] == "Optimizer.SGD.head.weight.0.forward.input.1"
    names = res.table["NPU Name"]
    updates = names.str.startswith("Optimizer.SGD.").to_numpy()
    assert updates.sum() == 3 * len(list(twins.build_ms(FAMILY).trainable_params()))
    assert (res.rows.gidx[updates] >= 0).all(), names[updates & (res.rows.gidx < 0)].tolist()
    # p_after = p_before - lr * grad: the means say so on both sides (lr 0.1)
    stem = "Optimizer.SGD.head.weight.0.forward"
    for side in ("NPU", "Bench"):
        mean = dict(zip(res.table[f"{side} Name"][updates], res.table[f"{side} mean"][updates].astype(float)))
        before, grad, after = (mean[f"{stem}.{s}"] for s in ("input.0", "input.1", "output.0"))
        assert after == pytest.approx(before - 0.1 * grad, abs=1e-6)


def test_weight_decay_on_one_parameter_is_named_at_its_update(dumps):
    d = diagnose(dumps[("mix", "weight_decay")])
    top = d["suspects"][0]
    assert top["api"] == "Optimizer.SGD.head.weight.0.forward" and top["kind"] == "introduced", \
        format_diagnosis(d)
    assert top["step"] == 0


def test_custom_bprop_scaling_is_traced_to_its_cell(dumps):
    """A custom bprop doubling the gradient: golden has no such Cell, and the first call reading its
    output names it (through the values nn.Dense's fused calls hand on unchanged)."""
    d = diagnose(dumps[("mix", "bprop_scale")])
    top = d["suspects"][0]
    origins = " ".join(str(r.get("origin")) for r in top["inputs"])
    assert top["kind"] == "foreign_input" and "Cell.block.grad_scale.GradScale.backward.0" in origins, \
        format_diagnosis(d)

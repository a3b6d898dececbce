"""The diagnosis' reading of compare tables: row names, the scale-free error, noise floors, and whole
tables msProbe itself wrote (diagnosis_samples/), so a user's existing msProbe CSVs diagnose too.
"""

import math
import os

import pandas as pd
import pytest

from msprobe.core.diagnosis import diagnose
from msprobe.core.compare.table_reader import number, result_from_table, split_row_name
from msprobe.core.diagnosis.errors import noise_floor, row_error
from msprobe.core.diagnosis.report import stack_line

SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "diagnosis_samples")

INF, NAN = math.inf, math.nan


@pytest.mark.parametrize("name, expected", [
    ("Functional.linear.3.forward.input.1", ("Functional.linear.3.forward", ".input.1", "input")),
    ("Functional.max_pool2d.0.forward.input.ceil_mode",
     ("Functional.max_pool2d.0.forward", ".input.ceil_mode", "input")),
    # backward: input = gradients of the forward outputs, output = gradients of the forward inputs
    ("Tensor.__add__.4.backward.output.1", ("Tensor.__add__.4.backward", ".output.1", "output")),
    ("VF.lstm.0.forward.output.1.0", ("VF.lstm.0.forward", ".output.1.0", "output")),
    # module paths hold digits and dots; parameters are inputs of the module call
    ("Module.blocks.0.attn.Attention.forward.0.input.0",
     ("Module.blocks.0.attn.Attention.forward.0", ".input.0", "input")),
    ("Module.blocks.1.ln1.LayerNorm.forward.0.parameters.weight",
     ("Module.blocks.1.ln1.LayerNorm.forward.0", ".parameters.weight", "input")),
    ("Module.head.Linear.backward.0.output.0", ("Module.head.Linear.backward.0", ".output.0", "output")),
    # parameter gradients: msProbe writes `.weight`, our dumps `.weight.0` (a list per parameter)
    ("Module.head.Linear.parameters_grad.0.weight", ("Module.head.Linear.parameters_grad.0", ".weight", "grad")),
    ("Cell.dense.Dense.parameters_grad.0.bias.0", ("Cell.dense.Dense.parameters_grad.0", ".bias.0", "grad")),
    ("x2.0.debug", ("x2.0.debug", "", "debug")),
    ("N/A", None),
])
def test_split_row_name(name, expected):
    assert split_row_name(name) == expected


@pytest.mark.parametrize("target, golden, metrics, error, nonfinite", [
    # identical statistics: no error whatever the scale
    ((3.0, -1.0, 0.5, 10.0), (3.0, -1.0, 0.5, 10.0), {}, 0.0, False),
    # norm off by 1%: 0.01; max/min/mean are measured against the golden range max(|3|, |-1|) = 3
    ((3.0, -1.0, 0.5, 10.1), (3.0, -1.0, 0.5, 10.0), {}, 0.01, False),
    ((3.3, -1.0, 0.5, 10.0), (3.0, -1.0, 0.5, 10.0), {}, 0.1, False),
    # a mean moving from 0 to 0.03 in a tensor of range 3 is 1%, not "infinitely" off
    ((3.0, -1.0, 0.03, 10.0), (3.0, -1.0, 0.0, 10.0), {}, 0.01, False),
    # tensor metrics: EucDist / Norm (relative L2) and MaxAbsErr / range win when larger
    ((3.0, -1.0, 0.5, 10.0), (3.0, -1.0, 0.5, 10.0), {"euc_dist": 0.5, "max_abs_err": 0.3}, 0.1, False),
    # all-zero golden: any difference is a full error (1), none is 0
    ((0.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 0.0), {}, 0.0, False),
    ((1.0, 0.0, 0.5, 1.0), (0.0, 0.0, 0.0, 0.0), {}, 1.0, False),
    # inf appearing on one side only: infinite error, flagged
    ((INF, -1.0, INF, INF), (3.0, -1.0, 0.5, 10.0), {}, INF, True),
    ((NAN, NAN, NAN, NAN), (3.0, -1.0, 0.5, 10.0), {}, INF, True),
    # the same inf on both sides is not a divergence; the finite statistics still count
    ((INF, -1.0, INF, INF), (INF, -1.0, INF, INF), {}, 0.0, False),
    # integer tensors have no mean/norm in msProbe tables (None): what is there is compared
    ((7.0, 0.0, None, None), (7.0, 0.0, None, None), {}, 0.0, False),
])
def test_row_error(target, golden, metrics, error, nonfinite):
    got, flagged = row_error(target, golden, metrics.get("euc_dist"), metrics.get("max_abs_err"))
    assert flagged is nonfinite
    assert got == pytest.approx(error) if math.isfinite(error) else got == error


@pytest.mark.parametrize("cell, value", [
    (1.5, 1.5), ("2.5", 2.5), (" inf", INF), ("-inf", -INF), ("N/A", None), ("None", None),
    ("unsupported", None), (None, None), ("12.5%", 0.125), (True, 1.0),
    ("slice(None, 2, None)", "slice(None, 2, None)"),
])
def test_number(cell, value):
    assert number(cell) == value


def test_noise_floor_is_the_coarser_dtype():
    assert noise_floor("torch.float32", "torch.float32") == pytest.approx(1e-5)
    assert noise_floor("torch.bfloat16", "torch.float32") == noise_floor("BFloat16") > noise_floor("torch.float16")
    assert noise_floor("torch.int64", "torch.int64") == 0.0


def _Result(table, mode):
    """A user's msProbe CSV, read back as a compare result."""
    return result_from_table(table, mode)


def _sample(name):
    return pd.read_csv(os.path.join(SAMPLES, name + ".gz"))


def test_any_object_with_a_table_diagnoses_like_a_read_back_table():
    class Plain:  # what a user may hand over: a CSV read with pandas and where it came from
        step, rank, mode = 0, 0, "statistics"
        table = _sample("cmp_statistics_mix_pert.csv")
    assert diagnose([Plain()])["suspects"] == diagnose([_Result(_sample("cmp_statistics_mix_pert.csv"),
                                                                "statistics")])["suspects"]


def test_msprobe_statistics_csv_perturbed_weight():
    """msProbe's own statistics compare of a run with one perturbed weight (blocks.1.fc1)."""
    d = diagnose([_Result(_sample("cmp_statistics_mix_pert.csv"), "statistics")])
    top = d["suspects"][0]
    assert (top["api"], top["kind"], top["direction"]) == ("Functional.linear.6.forward", "parameter", "forward")
    assert top["inputs"][0]["origin"] == "parameter 'weight' of Module.blocks.1.fc1.Linear"
    assert top["also_explains"] == ["Module.blocks.1.fc1.Linear.forward.0"]  # found without construct.json
    assert top["stack"].startswith("/home/user/anchor-bench/models.py:50 in forward")
    assert len(d["suspects"]) == 1


def test_msprobe_tensor_csv_bf16_autocast():
    """msProbe's tensor compare of a bf16-autocast run against fp32 (no bug planted): every value differs
    a little, and all of it is bf16 rounding and what the ops make of it."""
    result = _Result(_sample("cmp_tensor_mix_bf16.csv"), "tensor")
    d = diagnose([result])
    assert d["divergence"] is False and d["suspects"] == []
    assert d["precision"] == {"working": "bfloat16", "unit_roundoff": 2 ** -8, "inferred": True}
    assert d["verdict"].startswith("no divergence beyond bfloat16 precision")
    labels = result.table["Diagnosis"]
    assert set(labels) == {"agrees", "rounding", "inherits"}
    assert d["ranks"][0]["labels"] == labels.value_counts().to_dict()
    # the first op autocast runs in bf16: its output is rounded, nothing more
    row = result.table[result.table["NPU Name"] == "Functional.linear.0.forward.output.0"].iloc[0]
    assert (row["NPU Dtype"], row["Diagnosis"]) == ("torch.bfloat16", "rounding")


def test_stack_line_skips_installed_packages_and_msprobe_not_user_dirs_named_like_them():
    msprobe_dir = os.path.dirname(os.path.abspath(diagnose.__code__.co_filename))
    lines = [
        f"File {msprobe_dir}/engine.py, line 3, in wrapper, \n return f()",
        "File /opt/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py, line 134, in forward, \n"
        " return F.linear(input, self.weight, self.bias)",
        "File /home/me/proj/mindspore/net.py, line 21, in construct, \n h = mint.tanh(x)",   # user code
        "File /home/me/proj/train.py, line 9, in main, \n net(x)",
    ]
    assert stack_line(lines) == "/home/me/proj/mindspore/net.py:21 in construct: h = mint.tanh(x)"
    assert stack_line(lines[:2]) == f"{msprobe_dir}/engine.py:3 in wrapper: return f()"  # none is the user's
    assert stack_line([]) is None


@pytest.mark.parametrize("table", [pd.DataFrame(), pd.DataFrame({"NPU Name": ["not.a.row.name", "N/A"]})])
def test_tables_with_nothing_comparable_say_so(table):
    d = diagnose([_Result(table, "statistics")])
    assert d["divergence"] is False and d["suspects"] == []
    assert d["verdict"] == "nothing to diagnose: no value of the target has a counterpart in golden"


def test_tensor_mode_nan_at_different_positions_is_a_divergence():
    """Both tensors hold a nan, so their statistics agree (all nan); only the tensor metrics' message
    says the positions differ. The first call where that happens is where inf/nan enter."""
    nan = float("nan")
    moved = '["inf/nan at different positions in 2 of 8 elements"]'
    rows = []
    for name, stats, msg in (("Torch.exp.0.forward.input.0", (1.0, -1.0, 0.1, 2.0), "[]"),
                             ("Torch.exp.0.forward.output.0", (nan,) * 4, moved),
                             ("Torch.log.0.forward.input.0", (nan,) * 4, moved),
                             ("Torch.log.0.forward.output.0", (nan,) * 4, moved)):
        row = {"NPU Name": name, "Bench Name": name, "NPU Dtype": "torch.float32", "Bench Dtype": "torch.float32",
               "NPU Tensor Shape": "[8]", "Bench Tensor Shape": "[8]", "Cosine": nan, "EucDist": nan,
               "MaxAbsErr": nan, "Err_message": msg}
        for side in ("NPU", "Bench"):
            row.update({f"{side} {c}": v for c, v in zip(("max", "min", "mean", "l2norm"), stats)})
        rows.append(row)
    d = diagnose([_Result(pd.DataFrame(rows), "tensor")])
    assert [(s["api"], s["kind"]) for s in d["suspects"]] == [("Torch.exp.0.forward", "overflow")]
    assert d["suspects"][0]["outputs"][0]["flags"] == ["nonfinite"]
    assert d["suspects"][0]["reason"].endswith("holds inf/nan (golden's inf/nan sit elsewhere)")

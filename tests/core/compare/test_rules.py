"""Result/Err_message rules (msprobe-facts §8.6) and statistics cells on hand-written dumps, one
hand-computed expectation per case."""

import json

import pytest

from compare_fixtures import tensor
from msprobe.core.compare import compare_dumps


def _table(make_pair, target, golden, **kw):
    t, g = make_pair(target, golden, **kw)
    (res,) = compare_dumps(t, g, progress=False)
    return res.table.set_index("NPU Name")


def _call(inputs, outputs):
    return {"input_args": inputs, "input_kwargs": {}, "output": outputs}


def test_output_norm_error_ten_times_the_inputs_is_a_warning_on_the_first_output(make_pair):
    # input NormRelativeErr 1e-4; output.1 has 5e-3 (50x) -> the call's first output row is flagged
    golden = {"Functional.f.0.forward": _call([tensor(1.0, norm=1.0)], [tensor(2.0, norm=2.0), tensor(3.0, norm=3.0)])}
    target = {"Functional.f.0.forward": _call([tensor(1.0, norm=1.0001)], [tensor(2.0, norm=2.0), tensor(3.0, norm=3.015)])}
    tab = _table(make_pair, target, golden)
    assert tab.loc["Functional.f.0.forward.output.0", "Result"] == "warning"
    assert tab.loc["Functional.f.0.forward.output.1", "Result"] == "pass"
    assert tab.loc["Functional.f.0.forward.input.0", "Result"] == "pass"
    assert "10 times" in tab.loc["Functional.f.0.forward.output.0", "Err_message"]
    # 100 * |1.0001 - 1| / 1 = 0.01 (%)
    assert float(tab.loc["Functional.f.0.forward.input.0", "NormRelativeErr"][:-1]) == pytest.approx(0.01)


def test_inputs_within_ten_percent_and_output_off_by_half_is_an_error(make_pair):
    golden = {"Functional.f.0.forward": _call([tensor(1.0)], [tensor(1.0, norm=10.0)])}
    target = {"Functional.f.0.forward": _call([tensor(1.0, norm=1.05)], [tensor(1.0, norm=16.0)])}  # 5%, 60%
    tab = _table(make_pair, target, golden)
    row = tab.loc["Functional.f.0.forward.output.0"]
    assert row["Result"] == "error" and "50%" in row["Err_message"]
    assert row["NormRelativeErr"] == "60.0%"


def test_exact_inputs_then_output_off_by_over_ten_percent_is_a_warning(make_pair):
    golden = {"Functional.f.0.forward": _call([tensor(1.0)], [tensor(1.0, norm=10.0)]),
              "Functional.f.1.forward": _call([tensor(1.0)], [tensor(1.0, norm=10.0)])}
    target = {"Functional.f.0.forward": _call([tensor(1.0)], [tensor(1.0, norm=11.5)]),   # 15%: warning
              "Functional.f.1.forward": _call([tensor(1.0)], [tensor(1.0, norm=10.5)])}   # 5%: pass
    tab = _table(make_pair, target, golden)
    assert tab.loc["Functional.f.0.forward.output.0", "Result"] == "warning"
    assert tab.loc["Functional.f.1.forward.output.0", "Result"] == "pass"


def test_row_checks(make_pair):
    golden = {"Functional.g.0.forward": {
        "input_args": [tensor(1.0), tensor(2.0, shape=(4, 4)), tensor(1.0, rg=True), {"type": "int", "value": 3},
                       tensor(1.0), tensor(5.0, dtype="torch.float16")],
        "input_kwargs": {}, "output": [tensor(1.0)]}}
    target = {"Functional.g.0.forward": {
        "input_args": [tensor("nan", mn=0.0), tensor(2.0, shape=(4, 5)), tensor(1.0, rg=False),
                       {"type": "int", "value": 4}, tensor(1.0), tensor(5.0, dtype="torch.float32")],
        "input_kwargs": {}, "output": [tensor(1.0)]}}
    tab = _table(make_pair, target, golden)
    msg = {n: json.loads(tab.loc[f"Functional.g.0.forward.input.{i}", "Err_message"]) for i, n in
           enumerate(["nan", "shape", "rg", "scalar", "same", "dtype"])}
    assert msg["nan"] == ["error: target max/min is inf or nan while the golden's are finite"]
    assert msg["shape"] == ["error: target and golden shapes differ"]
    assert msg["rg"] == ["error: requires_grad differs between target and golden"]
    assert tab.loc["Functional.g.0.forward.input.2", "Requires_grad Consistent"] is False
    assert msg["scalar"] == ["error: non-tensor argument values differ"]
    assert msg["same"] == []
    assert msg["dtype"] == ["error: target and golden dtypes differ"]
    assert tab.loc["Functional.g.0.forward.input.4", "Result"] == "pass"
    assert tab.loc["Functional.g.0.forward.input.3", "NPU Dtype"] == "<class 'int'>"
    assert tab.loc["Functional.g.0.forward.input.3", "NPU Requires_grad"] == "N/A"


def test_statistics_cells_for_none_zero_and_infinite_values(make_pair):
    golden = {"Functional.h.0.forward": _call([tensor(0.0, mn=1.0, mean=None, norm="inf"), None], [tensor(1.0)])}
    target = {"Functional.h.0.forward": _call([tensor(0.5, mn=1.0, mean=None, norm="inf"), None], [tensor(1.0)])}
    tab = _table(make_pair, target, golden)
    row = tab.loc["Functional.h.0.forward.input.0"]
    assert row["Max diff"] == 0.5 and row["MaxRelativeErr"] == "inf"      # golden 0, a difference
    assert row["Min diff"] == 0 and row["MinRelativeErr"] == "0"           # equal
    assert row["Mean diff"] == 0 and row["MeanRelativeErr"] == "0"         # absent on both sides
    assert row["L2norm diff"] == 0 and row["NormRelativeErr"] == "0"       # the same infinity
    none = tab.loc["Functional.h.0.forward.input.1"]
    assert none["NPU Dtype"] == "None" and none["Result"] == "pass"


def test_fused_projection_names_and_exempt_apis(make_pair):
    golden = {"Module.attn.qkv.Linear.forward.0": _call([tensor(1.0)], [tensor(1.0, shape=(4, 12))]),
              "Torch.empty_like.0.forward": _call([tensor(1.0)], [tensor(1.0)])}
    target = {"Module.attn.qkv.Linear.forward.0": _call([tensor(1.0)], [tensor(1.0, shape=(4, 4, 3))]),
              "Torch.empty_like.0.forward": _call([tensor(1.0)], [tensor(9e9)])}
    tab = _table(make_pair, target, golden)
    assert tab.loc["Module.attn.qkv.Linear.forward.0.output.0", "Result"] == "pass"
    assert tab.loc["Torch.empty_like.0.forward.output.0", "Result"] == "pass"


def test_unmatched_rows(make_pair):
    golden = {"Functional.a.0.forward": _call([tensor(1.0, md5="00000001")], [tensor(1.0, md5="00000002")])}
    target = {"Functional.a.0.forward": _call([tensor(1.0, md5="00000001")], [tensor(1.0, md5="00000003")]),
              "Functional.b.0.forward": _call([tensor(1.0, md5="00000004")], [])}
    tab = _table(make_pair, target, golden)
    assert tab.loc["Functional.a.0.forward.input.0", "Result"] == "pass"
    assert tab.loc["Functional.a.0.forward.output.0", "Result"] == "error"
    b = tab.loc["Functional.b.0.forward.input.0"]
    assert b["Bench Name"] == "N/A" and b["BENCH MD5"] == "N/A"
    assert b["Result"] == "warning" and json.loads(b["Err_message"]) == ["no golden data matched"]
    golden_stats = {"Functional.a.0.forward": _call([tensor(1.0)], [tensor(1.0)])}
    target_stats = {"Functional.b.0.forward": _call([tensor(1.0)], [])}
    tab = _table(make_pair, target_stats, golden_stats)
    assert tab.loc["Functional.b.0.forward.input.0", "Result"] == "N/A"


def test_integer_widths_only_matter_within_one_framework(make_pair):
    golden = {"Functional.e.0.forward": _call([tensor(3, dtype="torch.int64", rg=None)], [tensor(1.0, rg=None)])}
    target = {"Functional.e.0.forward": _call([tensor(3, dtype="Int32", rg=None)], [tensor(1.0, dtype="Float32", rg=None)])}
    tab = _table(make_pair, target, golden, target_kw={"framework": "mindspore"})
    assert set(tab["Result"]) == {"pass"}
    tab = _table(make_pair, {"Functional.e.0.forward": _call([tensor(3, dtype="torch.int32")], [tensor(1.0)])},
                 {"Functional.e.0.forward": _call([tensor(3, dtype="torch.int64")], [tensor(1.0)])})
    assert tab.loc["Functional.e.0.forward.input.0", "Result"] == "error"

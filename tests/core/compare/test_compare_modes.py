"""compare_dumps on real PyTorch dumps (statistics, md5, tensor tasks) of a fp32 run against itself and
against runs with one planted difference; values checked against numbers computed here from the dumps."""

import json
import math
import os

import numpy as np
import pytest

from msprobe.core.compare import compare, compare_dumps
from msprobe.core.compare.columns import MODE_COLUMNS


def _records(runs, path):
    with open(runs.dump_json(path)) as f:
        return json.load(f)["data"]


def test_identical_runs_pass_everywhere_with_msprobe_columns(dumps):
    for task, mode in (("statistics", "statistics"), ("md5", "md5"), ("tensor", "tensor")):
        golden = dumps("fp32", task)
        (res,) = compare_dumps(dumps("fp32", task), golden, progress=False)
        assert res.mode == mode and res.step == 0 and res.rank == 0
        want = list(MODE_COLUMNS[mode]) + ["NPU_Stack_Info"] + (["Data_name"] if mode == "tensor" else [])
        assert list(res.table.columns) == want
        assert set(res.table["Result"]) == {"pass"}, res.table[res.table["Result"] != "pass"]
        assert (res.table["NPU Name"] == res.table["Bench Name"]).all()
        # one row per tensor/argument of every record: forward inputs, outputs, parameters, backward
        names = set(res.table["NPU Name"])
        assert "Module.fc1.Linear.forward.0.parameters.weight" in names
        assert "Module.fc1.Linear.parameters_grad.0.weight" in names
        assert "Functional.softmax.0.forward.input.dim" in names
        assert "Functional.linear.3.backward.output.0" in names
        assert bool(res)


def test_statistics_differences_are_target_minus_golden(dumps, runs):
    target, golden = dumps("perturbed", "statistics"), dumps("fp32", "statistics")
    (res,) = compare_dumps(target, golden, progress=False)
    t, g = _records(runs, target), _records(runs, golden)
    row = res.table.set_index("NPU Name").loc["Module.fc1.Linear.forward.0.parameters.weight"]
    tw, gw = t["Module.fc1.Linear.forward.0"]["parameters"]["weight"], g["Module.fc1.Linear.forward.0"]["parameters"]["weight"]
    assert row["Max diff"] == pytest.approx(tw["Max"] - gw["Max"])
    assert row["L2norm diff"] == pytest.approx(tw["Norm"] - gw["Norm"])
    assert row["NormRelativeErr"].endswith("%")
    assert float(row["NormRelativeErr"][:-1]) == pytest.approx(abs(tw["Norm"] - gw["Norm"]) / gw["Norm"] * 100)
    assert row["NPU l2norm"] == tw["Norm"] and row["Bench l2norm"] == gw["Norm"]
    # the perturbed weight changed fc1's output; nothing before fc1 in the forward changed
    first = res.table.set_index("NPU Name")
    assert first.loc["Functional.layer_norm.0.forward.output.0", "Max diff"] == 0
    assert first.loc["Functional.layer_norm.0.forward.output.0", "NormRelativeErr"] == "0"
    assert first.loc["Module.fc1.Linear.forward.0.output.0", "L2norm diff"] != 0


def test_md5_mode_flags_exactly_the_changed_checksums(dumps):
    target, golden = dumps("perturbed", "md5"), dumps("fp32", "md5")
    (res,) = compare_dumps(target, golden, progress=False)
    assert res.mode == "md5"
    tab = res.table
    tensor_rows = tab[tab["NPU MD5"] != "N/A"]
    differs = tensor_rows["NPU MD5"] != tensor_rows["BENCH MD5"]
    assert differs.any() and (~differs).any()
    assert set(tensor_rows[differs]["Result"]) == {"error"}
    assert set(tensor_rows[~differs]["Result"]) == {"pass"}
    assert "error: checksums differ" in json.loads(tensor_rows[differs]["Err_message"].iloc[0])
    # non-tensor arguments carry no checksum and are compared by value
    assert set(tab[tab["NPU MD5"] == "N/A"]["Result"]) == {"pass"}


def _metrics_here(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    diff = np.abs(a - b)
    rel = diff / np.where(b == 0, np.finfo(np.float32).eps, np.abs(b))
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return cos, float(np.linalg.norm(a - b)), float(diff.max()), float(rel.max()), \
        float(np.mean(rel < 0.001)), float(np.mean(rel < 0.005))


def test_tensor_mode_metrics_match_numpy_on_the_saved_tensors(dumps, runs):
    target, golden = dumps("softmax_bf16", "tensor"), dumps("fp32", "tensor")
    (res,) = compare_dumps(target, golden, progress=False)
    tab = res.table.set_index("NPU Name")
    row = tab.loc["Functional.softmax.0.forward.output.0"]
    data = os.path.join(runs.rank_dir(target), "dump_tensor_data")
    gdata = os.path.join(runs.rank_dir(golden), "dump_tensor_data")
    a = np.load(os.path.join(data, "Functional.softmax.0.forward.output.0.npy"))
    b = np.load(os.path.join(gdata, "Functional.softmax.0.forward.output.0.npy"))
    cos, euc, max_abs, max_rel, one_k, five_k = _metrics_here(a, b)
    assert row["Cosine"] == pytest.approx(round(cos, 6) if cos > 0.9999 else cos, abs=1e-9)
    assert row["EucDist"] == pytest.approx(euc, rel=1e-9)
    assert row["MaxAbsErr"] == pytest.approx(max_abs, rel=1e-9)
    assert row["MaxRelativeErr"] == pytest.approx(max_rel, rel=1e-9)
    assert row["One Thousandth Err Ratio"] == pytest.approx(one_k)
    assert row["Five Thousandths Err Ratio"] == pytest.approx(five_k)
    assert 0 < one_k < 1 and max_abs > 0
    # the bf16 softmax: dtype differs on its rows, the extra casts have no golden partner
    assert row["NPU Dtype"] == "torch.bfloat16" and row["Bench Dtype"] == "torch.float32"
    assert row["Result"] == "error"
    assert json.loads(row["Err_message"]) == ["error: target and golden dtypes differ"]
    cast = tab.loc["Tensor.to.0.forward.output.0"]
    assert cast["Bench Name"] == "N/A" and cast["Result"] == "N/A"
    assert row["Data_name"] == str(["Functional.softmax.0.forward.output.0.npy"] * 2)
    # non-tensor arguments are "unsupported", 0-d tensors (the loss) only get absolute/relative errors
    assert tab.loc["Functional.softmax.0.forward.input.dim", "Cosine"] == "unsupported"
    loss = tab.loc["Functional.cross_entropy.0.forward.output.0"]
    assert loss["Cosine"] == "unsupported" and isinstance(loss["MaxAbsErr"], float)


def test_tensor_mode_input_output_rule_on_perturbed_weight(dumps):
    """fc1's weight differs in one element: fc2's input (GELU of fc1) differs in 1/32 of its elements,
    its output everywhere: inputs agree (one-thousandth > 0.9), output does not (< 0.1) -> error."""
    (res,) = compare_dumps(dumps("perturbed", "tensor"), dumps("fp32", "tensor"), progress=False)
    tab = res.table.set_index("NPU Name")
    fc2_in = tab.loc["Module.fc2.Linear.forward.0.input.0"]
    fc2_out = tab.loc["Module.fc2.Linear.forward.0.output.0"]
    assert fc2_in["One Thousandth Err Ratio"] > 0.9 and fc2_in["Result"] == "pass"
    assert fc2_out["One Thousandth Err Ratio"] < 0.1
    assert fc2_out["Result"] == "error"
    assert "one-thousandth" in fc2_out["Err_message"]
    # the weight row itself: exactly one element differs by 0.25
    w = tab.loc["Module.fc1.Linear.forward.0.parameters.weight"]
    assert w["MaxAbsErr"] == pytest.approx(0.25, rel=1e-6)
    assert w["One Thousandth Err Ratio"] == pytest.approx(1 - 1 / w_numel(w["NPU Tensor Shape"]))


def w_numel(shape_text):
    return math.prod(json.loads(shape_text))


def test_several_steps_and_ranks_give_one_result_each(dumps, tmp_path):
    a = dumps("perturbed", "statistics", steps=2)
    b = dumps("fp32", "statistics", steps=2)
    results = compare_dumps(a, b, progress=False)
    assert [(r.step, r.rank) for r in results] == [(0, 0), (1, 0)]
    assert results[1].target_dir.endswith(os.path.join("step1", "rank0"))
    df = compare(a, b, progress=False)
    assert list(df.columns[:3]) == ["step", "rank", "NPU Name"]
    assert len(df) == sum(len(r.table) for r in results)
    # two step dirs pair whatever their numbers
    (one,) = compare_dumps(os.path.join(a, "step1"), os.path.join(b, "step0"), progress=False)
    assert one.step == 1


def test_different_tasks_are_refused(dumps):
    from msprobe.core.errors import MsprobeError
    with pytest.raises(MsprobeError, match="different tasks.*statistics.*tensor|different tasks.*tensor.*statistics"):
        compare_dumps(dumps("fp32", "statistics"), dumps("fp32", "tensor"), progress=False)


def test_ranks_pair_by_number_and_helper_process_dirs_are_ignored(dumps, runs, tmp_path):
    import shutil
    fp32, perturbed = dumps("fp32", "statistics"), dumps("perturbed", "statistics")
    for side, rank1_source in (("t", perturbed), ("g", fp32)):
        shutil.copytree(runs.rank_dir(fp32), tmp_path / side / "step0" / "rank0")
        shutil.copytree(runs.rank_dir(rank1_source), tmp_path / side / "step0" / "rank1")
    shutil.copytree(runs.rank_dir(perturbed), tmp_path / "t" / "step0" / "proc4242")  # a helper process
    results = compare_dumps(str(tmp_path / "t"), str(tmp_path / "g"), progress=False)
    assert [(r.step, r.rank, r.is_proc) for r in results] == [(0, 0, False), (0, 1, False)]
    by_rank = {r.rank: r.table for r in results}
    assert (by_rank[0]["Max diff"] == 0).all() and set(by_rank[0]["Result"]) == {"pass"}
    assert (by_rank[1]["L2norm diff"] != 0).any()

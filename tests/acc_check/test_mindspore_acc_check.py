"""acc_check on MindSpore dumps: the seed's Mint.where quick start exactly as written, the MindSpore
transformer block dumped by msprobe.mindspore (statistics -> random inputs, tensor -> real inputs),
and a planted low-precision custom API against its correct twin."""

import csv
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from acc_fixtures import SEED_WHERE, lowprec_dump, tensors_left_in_cycles

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

from msprobe.core.acc_check.input_data import TensorSource, rng_for  # noqa: E402
from msprobe.core.acc_check.runner import load_dump, run_acc_check  # noqa: E402
from msprobe.core.dump.reader import DumpReader  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(path):
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f))


def test_seed_quick_start_as_written(tmp_path):
    shutil.copy(SEED_WHERE, tmp_path / "dump.json")
    proc = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "acc_check", "-api_info", "./dump.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = rows(next(tmp_path.glob("accuracy_checking_result_*.csv")))
    details = rows(next(tmp_path.glob("accuracy_checking_details_*.csv")))
    # msProbe's own output for this dump (msprobe-samples/acc_check/ms_seed_where_*.csv)
    assert [(r["API Name"], r["Forward Test Success"], r["Backward Test Success"]) for r in result] == \
        [("Mint.where.0", "pass", "")]
    d = details[0]
    assert (d["API Name"], d["Bench Dtype"], d["Tested Dtype"], d["Shape"], float(d["Cosine"]),
            float(d["MaxAbsErr"]), float(d["MaxRelativeErr"]), d["Status"]) == \
        ("Mint.where.0.forward.output.0", "Int64", "Int64", "(1, 4096)", 1.0, 0.0, 0.0, "pass")


def test_seed_003_command_form(tmp_path):
    shutil.copy(SEED_WHERE, tmp_path / "dump.json")
    proc = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "-f", "mindspore", "run_ut", "-api_info",
                           "./dump.json", "-o", "./output"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert len(list((tmp_path / "output").glob("accuracy_checking_result_*.csv"))) == 1


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_transformer_block_dump(ms_dumps, tmp_path, task):
    dump = ms_dumps[task]
    report = run_acc_check(dump, out_path=str(tmp_path), progress=False)
    result = {r["API Name"]: r for r in rows(report.result_csv)}
    forwards = [k[: -len(".forward")] for k in DumpReader(dump).keys() if k.endswith(".forward")]
    assert list(result) == forwards
    checked = {n: r for n, r in result.items() if r["Forward Test Success"] != "SKIP"}
    assert {r["Forward Test Success"] for r in checked.values()} == {"pass"}
    # mint, Tensor methods/operators and primitives, those with constructor arguments too (recorded in
    # api_sources.json), all run, forward and backward
    for name in ("Mint.matmul.0", "Mint.softmax.0", "Tensor.__add__.0", "Primitive.dense.Dense.0",
                 "Primitive.layer_norm.LayerNorm.0"):
        assert result[name]["Forward Test Success"] == "pass" and result[name]["Backward Test Success"] == "pass"
    # only the optimizer's per-parameter update records are skipped
    skipped = {n: r["Message"] for n, r in result.items() if r["Forward Test Success"] == "SKIP"}
    assert skipped and all(n.startswith("Optimizer.") and "update of one parameter" in m
                           for n, m in skipped.items()), skipped
    details = rows(report.details_csv)
    mm = next(d for d in details if d["API Name"] == "Mint.matmul.0.forward.output.0")
    assert (mm["Bench Dtype"], mm["Tested Dtype"]) == ("Float64", "Float32")
    assert any(d["API Name"].startswith("Mint.matmul.0.backward.output.") for d in details)


def test_tensor_dump_replays_real_inputs(ms_dumps):
    reader, cases = load_dump(ms_dumps["tensor"])
    from msprobe.mindspore.acc_check.executor import create_executor
    case = next(c for c in cases if c.name == "Mint.matmul.0")
    run = create_executor().run(case, TensorSource(reader), rng_for(case.name))
    np.testing.assert_array_equal(run.inputs["forward.input.0"],
                                  reader.load_tensor(case.forward["input_args"][0]).array)
    np.testing.assert_allclose(run.forward[0].tested, reader.load_tensor(case.forward["output"][0]).array,
                               rtol=1e-5, atol=1e-6)


def test_checked_apis_leave_no_tensor_in_a_reference_cycle(ms_dumps):
    """Each API's tensors are freed when its check returns, not at the next garbage collection."""
    from msprobe.mindspore.acc_check.executor import create_executor
    left, checked = tensors_left_in_cycles(ms_dumps["statistics"], create_executor, ms.Tensor)
    assert not left
    assert checked > 10


def test_planted_defect_is_an_error_its_twin_passes(tmp_path):
    dump = lowprec_dump("mindspore", tmp_path / "dump")
    sys.path.insert(0, HERE)
    try:
        report = run_acc_check(dump, out_path=str(tmp_path / "out"), progress=False,
                               custom_apis=("LowPrec=ms_lowprec_ops",))
    finally:
        sys.path.remove(HERE)
    result = {r["API Name"]: r for r in rows(report.result_csv)}
    assert result["LowPrec.matmul_fp16_inside.0"]["Forward Test Success"] == "error"
    assert result["LowPrec.matmul_fp16_inside.0"]["Forward Dtype Check"] == "error"
    assert result["LowPrec.matmul_exact.0"]["Forward Test Success"] == "pass"
    assert result["LowPrec.matmul_exact.0"]["Forward Dtype Check"] == "pass"

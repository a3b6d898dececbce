"""acc_check on real PyTorch dumps: statistics (random inputs) and tensor (real inputs) dumps of the
transformer block end to end, a planted low-precision custom API against its correct twin, bf16 under
both verdicts, -save_error_data with its reproduce script, SKIP reasons, and the command line."""

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from acc_fixtures import tensors_left_in_cycles
from msprobe.core.acc_check.input_data import TensorSource, rng_for
from msprobe.core.acc_check.runner import load_dump, run_acc_check
from msprobe.core.dump.reader import DumpReader
from msprobe.pytorch import PrecisionDebugger

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(path):
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f))


def forward_names(dump_json):
    return [k[: -len(".forward")] for k in DumpReader(dump_json).keys() if k.endswith(".forward")]


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_transformer_dump_end_to_end(pt_dumps, tmp_path, task):
    dump = pt_dumps[task]
    report = run_acc_check(dump, out_path=str(tmp_path), progress=False)
    result = rows(report.result_csv)
    details = rows(report.details_csv)
    # every API of the dump has one row, in dump order, and all pass (CPU float32 vs float64); the
    # optimizer's per-parameter update records are no API: skipped, saying so
    assert [r["API Name"] for r in result] == forward_names(dump)
    updates = [r for r in result if r["API Name"].startswith("Optimizer.")]
    assert updates and all(r["Forward Test Success"] == "SKIP" and "update of one parameter" in r["Message"]
                           for r in updates)
    result = [r for r in result if r not in updates]
    assert {r["Forward Test Success"] for r in result} == {"pass"}
    backward = {k[: -len(".backward")] for k in DumpReader(dump).keys() if k.endswith(".backward")}
    for r in result:
        assert r["Backward Test Success"] == ("pass" if r["API Name"] in backward else ""), r
    # forward outputs and input gradients are compared, with both verdicts
    names = [d["API Name"] for d in details]
    assert "Functional.linear.0.forward.output.0" in names
    assert any(n.startswith("Functional.linear.0.backward.output.") for n in names)
    lin = next(d for d in details if d["API Name"] == "Functional.linear.0.forward.output.0")
    assert lin["Bench Dtype"] == "torch.float64" and lin["Tested Dtype"] == "torch.float32"
    assert float(lin["Cosine"]) > 0.999999 and float(lin["MaxAbsErr"]) < 1e-5
    assert int(lin["ReductionLength"]) == 16 and lin["Dtype Status"] == "pass"


def test_a_run_in_the_callers_process_gives_back_its_thread_count(pt_dumps, tmp_path):
    """run_acc_check checks on one intra-op thread, then the caller's training (a different thread count
    changes reductions' rounding) goes on with its own."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_acc_check(pt_dumps["statistics"], out_path=str(tmp_path), progress=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_checked_apis_leave_no_tensor_in_a_reference_cycle(pt_dumps):
    """Each API's inputs and outputs are freed when its check returns, not at the next garbage
    collection (a recursive closure in the argument builder once kept ~100 MB alive per worker)."""
    from msprobe.pytorch.acc_check.executor import create_executor
    left, checked = tensors_left_in_cycles(pt_dumps["statistics"], create_executor, torch.Tensor)
    assert not left
    assert checked > 20


def test_tensor_dump_replays_the_real_inputs(pt_dumps):
    """With a tensor dump the first linear gets the dumped input, so it reproduces the dumped output."""
    reader, cases = load_dump(pt_dumps["tensor"])
    from msprobe.pytorch.acc_check.executor import create_executor
    case = next(c for c in cases if c.name == "Functional.linear.0")
    run = create_executor().run(case, TensorSource(reader), rng_for(case.name))
    dumped_in = reader.load_tensor(case.forward["input_args"][0]).array
    assert np.array_equal(run.inputs["forward.input.0"], dumped_in)
    dumped_out = reader.load_tensor(case.forward["output"][0]).array
    np.testing.assert_allclose(run.forward[0].tested, dumped_out, rtol=1e-6, atol=1e-6)
    # without the saved tensors (a statistics dump) the same call gets random data in the recorded range
    source = TensorSource(reader, real_data=False)
    rand = create_executor().run(case, source, rng_for(case.name)).inputs["forward.input.0"]
    rec = case.forward["input_args"][0]
    assert not np.array_equal(rand, dumped_in)
    assert rand.min() == np.float32(rec["Min"]) and rand.max() == np.float32(rec["Max"])


@pytest.fixture(scope="module")
def custom_dump(tmp_path_factory):
    """A dump with the low-precision custom matmul, its correct twin, and a bf16 linear."""
    sys.path.insert(0, HERE)
    import lowprec_ops
    tmp = tmp_path_factory.mktemp("custom")
    dbg = PrecisionDebugger(dump_path=str(tmp / "dump"), level="L1", task="statistics")
    dbg.register_custom_api(lowprec_ops, "matmul_fp16_inside", "LowPrec")
    dbg.register_custom_api(lowprec_ops, "matmul_exact", "LowPrec")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 64, generator=g, requires_grad=True)
    b = torch.randn(64, 32, generator=g, requires_grad=True)
    w = torch.randn(24, 64, generator=g).to(torch.bfloat16)
    dbg.start()
    bad = lowprec_ops.matmul_fp16_inside(a, b)
    good = lowprec_ops.matmul_exact(a, b)
    (bad.sum() + good.sum()).backward()
    torch.nn.functional.linear(a.detach().to(torch.bfloat16), w)
    dbg.stop()
    dbg.step()
    dbg.close()
    sys.path.remove(HERE)
    from acc_fixtures import dump_json_of
    return dump_json_of(tmp / "dump")


def _cli(*args, env_extra=None, cwd=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "msprobe.cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def test_planted_defect_is_an_error_its_twin_passes(custom_dump, tmp_path):
    out = tmp_path / "out"
    proc = _cli("acc_check", "-api_info", custom_dump, "-o", str(out), "--custom_api", "LowPrec=lowprec_ops",
                "-save_error_data", env_extra={"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert proc.returncode == 0, proc.stderr
    result = {r["API Name"]: r for r in rows(next(out.glob("accuracy_checking_result_*.csv")))}
    bad, good = result["LowPrec.matmul_fp16_inside.0"], result["LowPrec.matmul_exact.0"]
    assert bad["Forward Test Success"] == "error" and bad["Forward Dtype Check"] == "error"
    assert "max abs err" in bad["Message"]
    assert good["Forward Test Success"] == "pass" and good["Forward Dtype Check"] == "pass"
    assert good["Backward Test Success"] == "pass"
    # bf16 linear: an error by the seed rule (bf16 rounding > 1e-4), fine by the dtype-aware rule
    lin = result["Functional.linear.0"]
    assert lin["Forward Test Success"] == "error" and lin["Forward Dtype Check"] == "pass"
    assert "LowPrec.matmul_fp16_inside.0" in proc.stdout  # the summary's worst APIs
    # error data: inputs, outputs, a one-API dump and a script that reproduces the verdict
    case_dir = out / "error_data" / "LowPrec.matmul_fp16_inside.0"
    saved = sorted(p.name for p in (case_dir / "dump_tensor_data").iterdir())
    assert "LowPrec.matmul_fp16_inside.0.forward.input.0.npy" in saved
    assert "LowPrec.matmul_fp16_inside.0.forward.output.0.tested.npy" in saved
    assert not (out / "error_data" / "LowPrec.matmul_exact.0").exists()
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rep = subprocess.run([sys.executable, str(case_dir / "reproduce.py")], capture_output=True, text=True,
                         env=env, timeout=300)
    assert rep.returncode == 0, rep.stderr
    assert "forward error" in rep.stdout and "dtype-aware error" in rep.stdout
    # the saved input is what the run used: replaying the one-API dump gives the same numbers
    sys.path.insert(0, HERE)
    try:
        replay = run_acc_check(str(case_dir / "dump.json"), out_path=str(tmp_path / "replay"), progress=False,
                               custom_apis=("LowPrec=lowprec_ops",))
    finally:
        sys.path.remove(HERE)
    first = {d["API Name"]: d for d in rows(next(out.glob("accuracy_checking_details_*.csv")))}
    again = rows(replay.details_csv)
    for d in again:
        assert d["MaxAbsErr"] == first[d["API Name"]]["MaxAbsErr"]


def test_skip_rows_say_why(tmp_path):
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 4], "Max": 1.0, "Min": -1.0,
         "requires_grad": False}
    data = {
        "Distributed.all_reduce.0.forward": {"input_args": [t], "input_kwargs": {}, "output": [t]},
        "NPU.npu_rms_norm.0.forward": {"input_args": [t], "input_kwargs": {}, "output": [t]},
        "Torch.no_such_api.0.forward": {"input_args": [t], "input_kwargs": {}, "output": [t]},
        "MyOps.fused.0.forward": {"input_args": [t], "input_kwargs": {}, "output": [t]},
        "Torch.sum.0.forward": {"input_args": [t, {"type": "my.Opaque", "value": None}], "input_kwargs": {},
                                "output": [t]},
        "Aten.mul.Tensor.0.forward": {"input_args": [t, t], "input_kwargs": {}, "output": [t]},
        "Torch.linalg_norm.0.forward": {"input_args": [t], "input_kwargs": {}, "output": [t]},
        "Torch.linalg_eigh.0.forward": {"input_args": [dict(t, dtype="torch.float16")], "input_kwargs": {},
                                        "output": [t]},
        "Functional.dropout.0.forward": {"input_args": [t], "output": [t], "input_kwargs": {
            "p": {"type": "float", "value": 0.5}, "training": {"type": "bool", "value": True}}},
        "Tensor.__getitem__.0.forward": {"input_args": [t, [{"type": "slice", "value": [0, 2, None]},
                                                            {"type": "ellipsis", "value": "..."}]],
                                         "input_kwargs": {}, "output": [t]},
    }
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                "dump_data_dir": None, "data": data}))
    report = run_acc_check(str(path), out_path=str(tmp_path / "out"), progress=False)
    result = {r["API Name"]: r for r in rows(report.result_csv)}
    assert result["Distributed.all_reduce.0"]["Forward Test Success"] == "SKIP"
    assert "communication op" in result["Distributed.all_reduce.0"]["Message"]
    assert "needs torch_npu" in result["NPU.npu_rms_norm.0"]["Message"]
    assert "has no such API" in result["Torch.no_such_api.0"]["Message"]
    assert "--custom_api MyOps=" in result["MyOps.fused.0"]["Message"]
    assert "my.Opaque cannot be rebuilt" in result["Torch.sum.0"]["Message"]
    # no kernel for that dtype here: the framework's own words, with the device and dtype
    eigh = result["Torch.linalg_eigh.0"]
    assert eigh["Forward Test Success"] == "SKIP"
    assert "cannot run on CPU (torch.float16)" in eigh["Message"] and "not implemented for 'Half'" in eigh["Message"]
    # resolved by name: aten overloads, torch.linalg under the Torch prefix, indexing with slices
    # dropout: both runs draw the same mask on the CPU (generators seeded alike)
    for name in ("Aten.mul.Tensor.0", "Torch.linalg_norm.0", "Tensor.__getitem__.0", "Functional.dropout.0"):
        assert result[name]["Forward Test Success"] == "pass", result[name]


def test_cli_aliases_and_one_line_errors(pt_dumps, tmp_path):
    proc = _cli("-f", "pytorch", "run_ut", "-api_info", pt_dumps["statistics"], "-o", str(tmp_path), "--no_progress")
    assert proc.returncode == 0, proc.stderr
    assert "verdict" in proc.stdout and len(list(tmp_path.glob("accuracy_checking_result_*.csv"))) == 1
    missing = _cli("acc_check", "-api_info", str(tmp_path / "nope.json"))
    assert missing.returncode == 1 and missing.stderr.strip().count("\n") == 0
    assert "nope.json" in missing.stderr and "Traceback" not in missing.stderr
    bad_resume = _cli("acc_check", "-api_info", pt_dumps["statistics"], "-csv_path", str(tmp_path / "x.csv"))
    assert bad_resume.returncode == 1 and "accuracy_checking_result_" in bad_resume.stderr
    assert "Traceback" not in bad_resume.stderr
    out_file = tmp_path / "a_file"
    out_file.write_text("x")
    bad_out = _cli("acc_check", "-api_info", pt_dumps["statistics"], "-o", str(out_file))
    assert bad_out.returncode == 1 and "is a file" in bad_out.stderr and "Traceback" not in bad_out.stderr
    l0 = tmp_path / "l0.json"
    l0.write_text('{"task": "statistics", "level": "L0", "framework": "pytorch", "data": '
                  '{"Module.fc.Linear.forward.0": {"input_args": [], "output": []}}}')
    only_modules = _cli("acc_check", "-api_info", str(l0))
    assert only_modules.returncode == 1 and "level L1 or mix is needed" in only_modules.stderr
    two = _cli("acc_check", "-api_info", pt_dumps["statistics"], "-d", "0", "1")
    assert two.returncode == 1 and "multi_acc_check" in two.stderr


def test_backward_through_the_engine_equals_autograd_grad():
    """The executor's vjp skips torch.autograd.grad's checks (whose first call imports sympy); its
    gradients must be autograd.grad's, unused inputs None included."""
    from msprobe.pytorch.acc_check.executor import _vjp
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    unused = torch.randn(2, requires_grad=True)
    outs = [torch.nn.functional.linear(x, w).tanh(), (x * x).sum(dim=0)]
    grads = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs]
    want = torch.autograd.grad(outs, [x, w, unused], grads, allow_unused=True, retain_graph=True)
    got = _vjp(outs, [x, w, unused], grads)
    assert got[2] is None and want[2] is None
    assert all(torch.equal(a, b) for a, b in zip(got[:2], want[:2]))


def test_a_run_does_not_import_sympy(pt_dumps, tmp_path):
    """0.3-0.5 s of sympy import per process (and per multi_acc_check worker) is what the engine
    call saves; a fresh process checking the transformer dump must not pay it."""
    code = ("import sys, torch\n"
            "from msprobe.core.acc_check.runner import run_acc_check\n"
            f"run_acc_check({pt_dumps['statistics']!r}, out_path={str(tmp_path)!r}, progress=False)\n"
            "print('sympy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"

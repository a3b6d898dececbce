"""Tensor mode across file formats: msProbe's PyTorch `.pt` files against our `.npy` files, and msProbe's
MindSpore `.npy` sample."""

import glob
import json
import os
import shutil

import numpy as np
import torch

from compare_fixtures import SAMPLES
from msprobe.core.compare import compare_dumps


def _as_pt_dump(src, dst):
    """Copy a dump, saving every tensor with torch.save as msProbe's PyTorch dumps do (bf16 as bf16)."""
    shutil.copytree(src, dst)
    rank = os.path.join(dst, "step0", "rank0")
    with open(os.path.join(rank, "dump.json")) as f:
        doc = json.load(f)
    for npy in glob.glob(os.path.join(rank, "dump_tensor_data", "*.npy")):
        array = np.load(npy)
        name = os.path.basename(npy)
        tensor = torch.from_numpy(array)
        if _dtype_of(doc["data"], name) == "torch.bfloat16":
            tensor = tensor.to(torch.bfloat16)
        torch.save(tensor, npy[:-4] + ".pt")
        os.remove(npy)
    doc["dump_data_dir"] = None
    with open(os.path.join(rank, "dump.json"), "w") as f:
        f.write(json.dumps(doc).replace('.npy"', '.pt"'))
    return dst


def _dtype_of(data, name):
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if v.get("data_name") == name:
                return v.get("dtype")
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def test_pt_files_against_npy_files_give_the_same_metrics(dumps, tmp_path):
    target, golden = dumps("softmax_bf16", "tensor"), dumps("fp32", "tensor")
    pt_target = _as_pt_dump(target, str(tmp_path / "pt"))
    assert glob.glob(os.path.join(pt_target, "step0", "rank0", "dump_tensor_data", "*.pt"))
    (npy_res,) = compare_dumps(target, golden, progress=False)
    (pt_res,) = compare_dumps(pt_target, golden, progress=False)
    cols = ["Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio", "Result"]
    assert (npy_res.table[cols].astype(str).to_numpy() == pt_res.table[cols].astype(str).to_numpy()).all()
    row = pt_res.table.set_index("NPU Name").loc["Functional.softmax.0.forward.output.0"]
    assert row["Data_name"] == str(["Functional.softmax.0.forward.output.0.pt",
                                    "Functional.softmax.0.forward.output.0.npy"])
    assert 0.99 < row["Cosine"] < 1.0


def test_msprobe_mindspore_tensor_sample(tmp_path):
    src = os.path.join(SAMPLES, "ms_dump", "tensor_L1_statistics_shim")
    rank = tmp_path / "step0" / "rank0"
    (rank / "dump_tensor_data").mkdir(parents=True)
    for name in ("dump.json", "stack.json", "construct.json"):
        shutil.copy(os.path.join(src, name), rank / name)
    shutil.copy(os.path.join(src, "Mint.where.0.forward.output.0.npy"), rank / "dump_tensor_data")
    (res,) = compare_dumps(str(tmp_path), str(tmp_path), progress=False)
    assert res.mode == "tensor" and res.target_framework == "mindspore"
    tab = res.table.set_index("NPU Name")
    row = tab.loc["Mint.where.0.forward.output.0"]
    assert row["Cosine"] == 1.0 and row["MaxAbsErr"] == 0.0 and row["Result"] == "pass"
    # the sample ships one tensor file: every other row says so and compares nothing
    other = tab.loc["Mint.where.0.forward.input.1"]
    assert other["Cosine"] == "N/A" and "tensor file unreadable" in other["Err_message"]
    assert "Mint.where.0.forward.input.1.npy" in other["Err_message"]


def test_saved_tensors_of_different_shapes_or_garbage_are_row_messages(tmp_path):
    from compare_fixtures import tensor, write_dump
    rows = {}
    for side, shape in (("t", (2, 3)), ("g", (3, 2))):
        data = {"Functional.f.0.forward": {
            "input_args": [tensor(1.0, shape=shape, data_name="Functional.f.0.forward.input.0.npy")],
            "input_kwargs": {}, "output": [tensor(1.0, shape=(4,), data_name="Functional.f.0.forward.output.0.npy")]}}
        rank = write_dump(tmp_path / side, data, task="tensor")
        os.makedirs(os.path.join(rank, "dump_tensor_data"))
        np.save(os.path.join(rank, "dump_tensor_data", "Functional.f.0.forward.input.0.npy"), np.ones(shape, np.float32))
        with open(os.path.join(rank, "dump_tensor_data", "Functional.f.0.forward.output.0.npy"), "wb") as f:
            f.write(b"not an npy file" if side == "t" else np.ones(4, np.float32).tobytes())
        rows[side] = rank
    (res,) = compare_dumps(rows["t"], rows["g"], progress=False)
    tab = res.table.set_index("NPU Name")
    shape_row = tab.loc["Functional.f.0.forward.input.0"]
    assert shape_row["Result"] == "error"
    assert "shapes differ" in shape_row["Err_message"] and "[2, 3] vs [3, 2]" in shape_row["Err_message"]
    bad = tab.loc["Functional.f.0.forward.output.0"]
    assert bad["Cosine"] == "N/A" and "not an .npy array file" in bad["Err_message"]


def test_worker_processes_give_the_serial_results(dumps, monkeypatch):
    from msprobe.core.compare import tensor_mode
    target, golden = dumps("perturbed", "tensor"), dumps("fp32", "tensor")
    (serial,) = compare_dumps(target, golden, progress=False, workers=1)
    monkeypatch.setattr(tensor_mode, "PARALLEL_MIN_BYTES", 0)
    (pooled,) = compare_dumps(target, golden, progress=True, workers=2)
    assert serial.table.astype(str).equals(pooled.table.astype(str))
    assert (pooled.table["Cosine"] != "N/A").sum() > 100

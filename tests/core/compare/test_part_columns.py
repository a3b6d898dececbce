"""A Parquet part's columns are the csv's, typed from the pair's rows: the relative errors in percent,
NaN where the csv says Nan, null where it says N/A, requires_grad as booleans (null where unknown), a
str argument's statistics null and a bool argument's 0/1, as the compare computes with them."""

import csv
import glob
import math
import os

import orjson
import pytest

from msprobe.core.compare import write_compare


def _tensor(mx, rg=True):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 16], "Max": mx, "Min": mx,
            "Mean": mx, "Norm": mx, "requires_grad": rg}


def _dump(root, target):
    data = {"Functional.linear.0.forward": {
        "input_args": [_tensor(1.0, rg=None if target else True), _tensor("NaN" if target else 1.0),
                       {"type": "str", "value": "3"}, {"type": "bool", "value": True}],
        "input_kwargs": {},
        "output": [_tensor(2.25 if target else 2.0), _tensor(None if target else 1.0)]}}
    if target:  # a call the golden run does not make
        data["Functional.gelu.1.forward"] = {"input_args": [_tensor(0.5, rg=False)], "input_kwargs": {},
                                             "output": [_tensor(0.5)]}
    d = os.path.join(root, "step0", "rank0")
    os.makedirs(d)
    doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
    with open(os.path.join(d, "dump.json"), "wb") as f:
        f.write(orjson.dumps(doc))
    return str(root)


def test_part_holds_the_rows_numbers_and_flags(tmp_path, monkeypatch):
    pq = pytest.importorskip("pyarrow.parquet")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "out"
    write_compare(_dump(tmp_path / "t", True), _dump(tmp_path / "g", False), str(out), progress=False,
                  keep_tables=False, timestamp="20260101000000", resume=True)
    part = pq.read_table(glob.glob(str(out / "rows" / "step=0" / "rank=0" / "part.parquet"))[0])
    rows = {r["NPU Name"]: r for r in part.to_pylist()}
    with open(glob.glob(str(out / "*.csv"))[0], newline="", encoding="utf-8") as f:
        cells = {r["NPU Name"]: r for r in csv.DictReader(f)}
    assert set(rows) == set(cells)
    types = {f.name: str(f.type) for f in part.schema}
    assert types["MaxRelativeErr"] == types["NPU max"] == "double"
    assert types["NPU Requires_grad"] == types["Requires_grad Consistent"] == "bool"
    assert types["Result"] == "string"

    out0 = rows["Functional.linear.0.forward.output.0"]
    assert cells["Functional.linear.0.forward.output.0"]["MaxRelativeErr"] == "12.5%"
    assert out0["MaxRelativeErr"] == 12.5 and out0["Max diff"] == 0.25
    assert out0["NPU max"] == 2.25 and out0["Bench max"] == 2.0 and out0["NPU Requires_grad"] is True

    nan = rows["Functional.linear.0.forward.input.1"]
    assert cells["Functional.linear.0.forward.input.1"]["Max diff"] == "Nan"
    assert math.isnan(nan["Max diff"]) and math.isnan(nan["MaxRelativeErr"])
    assert nan["NPU max"] is None and nan["Bench max"] == 1.0  # a NaN statistic: null, as a missing one

    absent = rows["Functional.linear.0.forward.output.1"]
    assert cells["Functional.linear.0.forward.output.1"]["Max diff"] == "N/A"
    assert absent["Max diff"] is None and absent["MaxRelativeErr"] is None and absent["NPU max"] is None

    unknown = rows["Functional.linear.0.forward.input.0"]
    assert unknown["NPU Requires_grad"] is None and unknown["Bench Requires_grad"] is True
    assert unknown["Requires_grad Consistent"] is True

    assert rows["Functional.linear.0.forward.input.2"]["NPU max"] is None  # a str argument
    assert rows["Functional.linear.0.forward.input.3"]["NPU max"] == 1.0  # a bool argument

    unpaired = rows["Functional.gelu.1.forward.input.0"]
    assert unpaired["Bench Name"] == "N/A" and unpaired["Bench max"] is None and unpaired["Max diff"] is None
    assert unpaired["NPU Requires_grad"] is False and unpaired["Bench Requires_grad"] is None

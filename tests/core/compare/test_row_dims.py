"""A tensor's shape travels typed from the dump to the diagnosis: `rows.py` keeps each record's shape as
`dims` (a tuple of ints) beside the text the table shows, the table reader turns a shape cell into the
same, and the diagnosis' rows take their element counts from it."""

import os

import orjson

from msprobe.core.compare import compare_dumps
from msprobe.core.compare.rows import frame_from_records
from msprobe.core.compare.table_reader import dims, result_from_table
from msprobe.core.diagnosis.calls import calls_from_rows


def _tensor(shape):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": 1.0, "Min": -1.0,
            "Mean": 0.0, "Norm": 2.0, "requires_grad": False}


def test_rows_keep_each_shape_typed_beside_its_text():
    shapes = [[4, 64], [], (2, 3), [True], [-1], [[2]], "[4, 64]", None]
    data = {f"Functional.f.{i}.forward": {"input_args": [_tensor(s)], "input_kwargs": {}, "output": []}
            for i, s in enumerate(shapes)}
    data["Functional.f.99.forward"] = {"input_args": [{"type": "int", "value": 3}], "input_kwargs": {}, "output": []}
    frame = frame_from_records(data)
    assert frame["shape"].tolist() == ["[4, 64]", "[]", "[2, 3]", "[True]", "[-1]", "[[2]]", "[4, 64]", "None", "[]"]
    assert frame["dims"].tolist() == [(4, 64), (), (2, 3), None, None, None, None, None, None]


def test_a_shape_cell_is_read_into_dims():
    assert dims("[4, 64]") == (4, 64) and dims(" [ 8 ] ") == (8,) and dims("[]") == ()
    assert dims("None") is None and dims("[-1]") is None and dims("[2.0]") is None and dims(float("nan")) is None


def _dump(root, value):
    d = os.path.join(root, "step0", "rank0")
    os.makedirs(d)
    rec = dict(_tensor([4, 16]), Max=value)
    data = {"Functional.linear.0.forward": {"input_args": [_tensor([4, 8]), _tensor([16, 8])], "input_kwargs": {},
                                            "output": [rec]}}
    with open(os.path.join(d, "dump.json"), "wb") as f:
        f.write(orjson.dumps({"task": "statistics", "level": "L1", "framework": "pytorch", "data": data}))
    return str(root)


def test_the_diagnosis_rows_count_elements_from_the_typed_shape(tmp_path):
    res = compare_dumps(_dump(tmp_path / "t", 1.5), _dump(tmp_path / "g", 1.0), progress=False)[0]
    (call,) = calls_from_rows(res.rows)
    assert [(r.dims, r.numel) for r in call.rows] == [((4, 8), 32), ((16, 8), 128), ((4, 16), 64)]
    # the same table written and read back gives the same rows
    (again,) = calls_from_rows(result_from_table(res.table).rows)
    assert [(r.dims, r.numel) for r in again.rows] == [((4, 8), 32), ((16, 8), 128), ((4, 16), 64)]

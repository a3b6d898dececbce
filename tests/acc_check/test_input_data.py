"""Random inputs keep what the record says (shape, dtype, range, extremes, inf/nan, bool/int ranges),
and every API's data depends only on its name and the seed."""

import math

import numpy as np
import pytest

from msprobe.core.acc_check.input_data import random_array, rng_for
from msprobe.core.acc_check.input_spec import TensorSpec, UnsupportedArgument, cases_from_dump, spec_tree


def spec(dtype, shape, mx, mn):
    return TensorSpec(dtype, dtype, tuple(shape), mx, mn, None, None)


@pytest.mark.parametrize("dtype,shape,mx,mn", [
    ("float32", (4, 5), 3.5, -2.0),
    ("float16", (7,), 0.25, 0.125),
    ("bfloat16", (3, 3), 100.0, -100.0),     # generated as float32, the executor casts to bf16
    ("float64", (2, 2, 2), 1e-30, -1e-30),
])
def test_float_range_and_extremes(dtype, shape, mx, mn):
    a = random_array(spec(dtype, shape, mx, mn), rng_for("Torch.x.0"))
    assert a.shape == shape
    flat = a.reshape(-1).astype(np.float64)
    assert flat.min() >= np.float64(np.asarray(mn, a.dtype)) and flat.max() <= np.float64(np.asarray(mx, a.dtype))
    # the recorded extremes are present: first element Min, last Max
    assert flat[0] == np.asarray(mn, a.dtype) and flat[-1] == np.asarray(mx, a.dtype)


def test_nonfinite_statistics_are_reinserted():
    a = random_array(spec("float32", (100,), math.inf, -math.inf), rng_for("a"))
    assert np.isposinf(a).sum() == 1 and np.isneginf(a).sum() == 1
    assert np.isfinite(a).sum() == 98
    b = random_array(spec("float32", (10,), math.nan, -1.0), rng_for("b"))
    assert np.isnan(b).sum() == 1 and b[0] == -1.0
    c = random_array(spec("float32", (5,), math.inf, math.inf), rng_for("c"))  # an all-inf tensor
    assert np.isposinf(c).all()


def test_int_and_bool_ranges():
    a = random_array(spec("int64", (1000,), 9, 3), rng_for("i"))
    assert a.dtype == np.int64 and a.min() == 3 and a.max() == 9
    assert set(np.unique(a)) == set(range(3, 10))
    # bool records: Max = any, Min = all
    assert not random_array(spec("bool", (1, 4096), False, False), rng_for("b")).any()
    assert random_array(spec("bool", (8,), True, True), rng_for("b")).all()
    mixed = random_array(spec("bool", (64,), True, False), rng_for("b"))
    assert mixed.any() and not mixed.all()


def test_same_name_same_data_other_name_other_data():
    s = spec("float32", (256,), 1.0, -1.0)
    assert np.array_equal(random_array(s, rng_for("Functional.linear.3")), random_array(s, rng_for("Functional.linear.3")))
    assert not np.array_equal(random_array(s, rng_for("Functional.linear.3")),
                              random_array(s, rng_for("Functional.linear.4")))


def test_spec_tree_restores_values_and_refuses_what_it_cannot():
    tree = spec_tree([{"type": "int", "value": 3}, {"type": "slice", "value": [0, None, 2]},
                      [{"type": "int", "value": 256}], None, {"type": "torch.Tensor", "dtype": "torch.bfloat16",
                                                            "shape": [2], "Max": "inf", "Min": 0.0}])
    assert tree[0].value == 3 and tree[1].value == [0, None, 2] and tree[2][0].value == 256 and tree[3] is None
    assert tree[4].dtype == "bfloat16" and tree[4].max == math.inf
    with pytest.raises(UnsupportedArgument, match="communication op"):
        spec_tree({"type": "torch.ProcessGroup", "group_ranks": [0, 1]})
    with pytest.raises(UnsupportedArgument, match="my.Thing cannot be rebuilt"):
        spec_tree({"type": "my.Thing", "value": None})
    with pytest.raises(UnsupportedArgument, match="dtype 'torch.qint8'"):
        spec_tree({"type": "torch.Tensor", "dtype": "torch.qint8", "shape": [1]})


def test_cases_pair_forward_with_backward_and_drop_modules():
    data = {"Module.l.Linear.forward.0": {}, "Functional.linear.0.forward": {"input_args": []},
            "Tensor.add_.2.forward": {"input_args": []}, "Functional.linear.0.backward": {"input": []},
            "Aten.add.Tensor.0.forward": {"input_args": []}, "Torch.orphan.0.backward": {"input": []}}
    cases = cases_from_dump(data)
    assert [(c.name, c.prefix, c.api, c.backward is not None) for c in cases] == [
        ("Functional.linear.0", "Functional", "linear", True), ("Tensor.add_.2", "Tensor", "add_", False),
        ("Aten.add.Tensor.0", "Aten", "add.Tensor", False)]

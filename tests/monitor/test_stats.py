"""The PyTorch adapter's batched ops against the numpy oracle (`stats_from_array`), including the
edge rows: NaN and inf elements, exact and near zeros, integer and bf16 tensors, empty tensors."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from msprobe.core.monitor.ops import OPS, stats_from_array  # noqa: E402
from msprobe.pytorch.monitor.stats import TensorStats  # noqa: E402

ALL = tuple(OPS)


def close(a, b):
    return all((math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-5, abs=1e-6) for x, y in zip(a, b))


CASES = {
    "randn": torch.randn(7, 5),
    "with zeros": torch.tensor([0.0, 1e-9, -1e-9, 2.0, -3.0, 1e-7]),  # 3 of 6 below eps=1e-8
    "with nan": torch.tensor([1.0, float("nan"), 2.0, float("nan")]),  # nans = 2, others nan
    "with inf": torch.tensor([1.0, float("inf"), -2.0]),                # norm/max inf, nans 0
    "int64": torch.tensor([[3, 0], [5, 7]]),
    "bf16": torch.randn(33).to(torch.bfloat16),                         # oracle sees the bf16 values
    "non-contiguous": torch.randn(6, 4).t(),
    "scalar": torch.tensor(-4.5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_single_tensor_matches_oracle(name):
    t = CASES[name]
    stats = TensorStats(ALL, 1e-8)
    want = stats_from_array(t.float().numpy(), ALL, 1e-8)
    assert close(stats.of(t), want), (name, stats.of(t), want)


def test_empty_tensor():
    got = TensorStats(ALL, 1e-8).of(torch.empty(0, 3))
    assert [math.isnan(v) for v in got] == [True, True, True, True, False, False] and got[4:] == [0.0, 0.0]


@pytest.mark.parametrize("ops", [ALL, ("nans",), ("zeros", "mean"), ("max", "min")])
def test_group_matches_single(ops):
    torch.manual_seed(0)
    ts = [torch.randn(4, 3), torch.zeros(5), torch.tensor([float("nan"), 1.0]), torch.randn(2, 2, 2) * 100]
    stats = TensorStats(ops, 1e-8)
    matrix = stats.raw_many(ts).tolist()
    for t, raw in zip(ts, matrix):
        assert close(stats.finish(raw, t.numel()), stats_from_array(t.numpy(), ops, 1e-8))


def test_mixed_dtypes_fall_back_per_tensor():
    ts = [torch.randn(3), torch.arange(4)]
    stats = TensorStats(ALL, 1e-8)
    rows = stats.raw_many(ts).tolist()
    assert close(stats.finish(rows[1], 4), stats_from_array(np.arange(4), ALL, 1e-8))


def test_bf16_group_norm_is_accumulated_in_float32():
    torch.manual_seed(0)
    ts = [torch.randn(4096).to(torch.bfloat16) for _ in range(3)]
    stats = TensorStats(("norm",), 1e-8)
    got = [row[0] for row in stats.raw_many(ts).tolist()]
    want = [float(np.linalg.norm(t.float().numpy().astype(np.float64))) for t in ts]
    assert got == pytest.approx(want, rel=1e-5)     # a bf16 accumulation would be off by ~1e-3

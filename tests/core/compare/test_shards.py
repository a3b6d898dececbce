"""Merging a sharded run's per-rank records into whole-tensor records (core/compare/shards.py): a table
of hand-computed merges, then a real tensor-mode compare of a 2-rank dump against one process."""

import math
import os

import numpy as np
import pytest

from compare_fixtures import write_dump
from msprobe.core.compare.engine import compare_dumps
from msprobe.core.compare.shards import ShardMerge
from msprobe.core.dump.tensor_files import save_npy


def rec(shape, mx, mn, mean, norm, shard=None, **extra):
    r = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": mx, "Min": mn, "Mean": mean,
         "Norm": norm, "requires_grad": False, **extra}
    if shard:
        r["shard"] = shard
    return r


def shard(placement, coordinate, local, offset):
    return {"placements": [placement], "mesh": [0, 1], "coordinate": [coordinate], "local_shape": local,
            "offset": offset}


def merged_output(ranks, golden=None):
    datas = [{"Functional.f.0.forward": {"input_args": [], "input_kwargs": {}, "output": [r]}} for r in ranks]
    hint = {"Functional.f.0.forward": {"output": [golden]}} if golden else None
    return ShardMerge(hint=hint).merge(datas)["Functional.f.0.forward"]["output"][0]


def test_row_shards_merge_into_whole_tensor_statistics():
    # rows [2, 4] of a [4, 4] tensor on each rank: 8 elements each
    a = rec([4, 4], 3.0, -1.0, 0.5, 4.0, shard("Shard(0)", 0, [2, 4], [0, 0]))
    b = rec([4, 4], 2.0, -5.0, -1.5, 3.0, shard("Shard(0)", 1, [2, 4], [2, 0]))
    m = merged_output([a, b])
    assert m["shape"] == [4, 4] and "shard" not in m
    assert (m["Max"], m["Min"]) == (3.0, -5.0)          # max of maxes, min of mins
    assert m["Mean"] == pytest.approx((0.5 * 8 - 1.5 * 8) / 16)  # element-weighted
    assert m["Norm"] == pytest.approx(5.0)             # sqrt(4^2 + 3^2)


def test_uneven_and_empty_shards_weigh_by_their_elements():
    # FSDP2's Shard(0) of 3 rows over 2 ranks: 2 rows and 1 row; a third rank holding none is skipped
    a = rec([3, 2], 1.0, 0.0, 0.25, 1.0, shard("Shard(0)", 0, [2, 2], [0, 0]))
    b = rec([3, 2], 4.0, 4.0, 4.0, 8.0, shard("Shard(0)", 1, [1, 2], [2, 0]))
    c = rec([3, 2], None, None, None, None, shard("Shard(0)", 2, [0, 2], [3, 0]))
    m = merged_output([a, b, c])
    assert m["Mean"] == pytest.approx((0.25 * 4 + 4.0 * 2) / 6) and m["Norm"] == pytest.approx(math.sqrt(65))


def test_replicas_count_once_and_partial_sums_have_no_statistics():
    r0 = rec([4], 1.0, 0.0, 0.5, 1.0, shard("Replicate", 0, [4], [0]))
    r1 = rec([4], 1.0, 0.0, 0.5, 1.0, shard("Replicate", 1, [4], [0]))
    assert merged_output([r0, r1])["Mean"] == 0.5 and merged_output([r0, r1])["Norm"] == 1.0
    p0 = rec([4], 1.0, 0.0, 0.5, 1.0, shard("Partial(sum)", 0, [4], [0]))
    p1 = rec([4], 2.0, 0.0, 0.5, 1.0, shard("Partial(sum)", 1, [4], [0]))
    m = merged_output([p0, p1])
    assert m["shape"] == [4] and (m["Max"], m["Min"], m["Mean"], m["Norm"]) == (None, None, None, None)


def test_plain_local_tensors_concatenate_where_the_golden_shape_says():
    # tensor parallel: each rank's [4, 16] half of a [4, 32] activation; same shapes, so only the golden's
    # shape tells the split
    a, b = rec([4, 16], 1.0, 0.0, 0.5, 2.0), rec([4, 16], 3.0, 0.0, 1.5, 2.0)
    m = merged_output([a, b], golden=rec([4, 32], 3.0, 0.0, 1.0, 2.83))
    assert m["shape"] == [4, 32] and m["Max"] == 3.0 and m["Mean"] == 1.0
    # without a golden of another shape they are replicas: rank 0's record
    assert merged_output([a, b], golden=rec([4, 16], 1.0, 0.0, 0.5, 2.0)) == a
    # data parallel with uneven batches: the shapes differ in one dimension, concatenated along it
    c, d = rec([3, 8], 1.0, -1.0, 0.0, 1.0), rec([1, 8], 2.0, 2.0, 2.0, 4.0)
    m = merged_output([c, d])
    assert m["shape"] == [4, 8] and m["Mean"] == pytest.approx(0.5) and m["Norm"] == pytest.approx(math.sqrt(17))


def test_nan_and_inf_pieces_keep_their_tokens():
    a = rec([2], "inf", 0.0, "inf", "inf", shard("Shard(0)", 0, [1], [0]))
    b = rec([2], "nan", "nan", "nan", "nan", shard("Shard(0)", 1, [1], [1]))
    m = merged_output([a, b])
    assert (m["Max"], m["Mean"]) == ("nan", "nan")
    assert merged_output([a, rec([2], 1.0, -2.0, 0.0, 1.0, shard("Shard(0)", 1, [1], [1]))])["Min"] == -2.0


def _save(rank_dir, array):
    os.makedirs(os.path.join(rank_dir, "dump_tensor_data"), exist_ok=True)
    save_npy(os.path.join(rank_dir, "dump_tensor_data", "Functional.f.0.forward.output.0.npy"), array)


def test_tensor_mode_assembles_shards_and_compares_them_with_the_whole(tmp_path):
    whole = np.arange(32, dtype=np.float32).reshape(4, 8)
    golden = write_dump(tmp_path / "single", {"Functional.f.0.forward": {"input_args": [], "input_kwargs": {},
                        "output": [rec([4, 8], 31.0, 0.0, 15.5, 1.0, data_name="Functional.f.0.forward.output.0.npy")]}},
                        task="tensor")
    _save(golden, whole)
    for rank in (0, 1):
        part = whole[:, 4 * rank:4 * rank + 4] + (0.5 if rank == 1 else 0.0)  # rank 1's half is off
        d = write_dump(tmp_path / "sharded", {"Functional.f.0.forward": {"input_args": [], "input_kwargs": {},
                       "output": [rec([4, 8], 0.0, 0.0, 0.0, 0.0, shard("Shard(1)", rank, [4, 4], [0, 4 * rank]),
                                      data_name="Functional.f.0.forward.output.0.npy")]}}, task="tensor", rank=rank)
        _save(d, part)
    (res,) = compare_dumps(str(tmp_path / "sharded"), str(tmp_path / "single"), progress=False)
    row = res.table.iloc[0]
    assert res.merged_ranks == 2 and row["NPU Tensor Shape"] == "[4, 8]"
    assert float(row["MaxAbsErr"]) == pytest.approx(0.5) and float(row["Cosine"]) < 1.0

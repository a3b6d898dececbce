"""MindSpore host statistics: the one-pass kernel and numpy agree; inf/nan keep numpy's answer."""

import numpy as np
import pytest

from msprobe.mindspore.statistics import array_stats


def _numpy(a):
    f = a.astype(np.float64).reshape(-1)
    return f.max(), f.min(), f.mean(), np.sqrt(np.dot(f, f))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_statistics_match_numpy(dtype):
    a = (np.random.default_rng(3).standard_normal((64, 300)) * 2 + 0.25).astype(dtype)
    rec = array_stats(a)
    mx, mn, mean, norm = _numpy(a)
    assert rec["Max"] == mx and rec["Min"] == mn
    assert rec["Mean"] == pytest.approx(mean, rel=1e-5, abs=1e-6)
    assert rec["Norm"] == pytest.approx(norm, rel=1e-5)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8])
def test_integer_statistics_match_numpy_with_ints_for_max_and_min(dtype, monkeypatch):
    """int64 and int32 through the one-pass kernel, other integers through numpy: the same record."""
    from msprobe.mindspore import statistics
    a = np.random.default_rng(5).integers(0, 200, (32, 70)).astype(dtype)
    rec = array_stats(a)
    monkeypatch.setattr(statistics, "_NATIVE_KINDS", {})
    assert rec == array_stats(a) and type(rec["Max"]) is int and type(rec["Min"]) is int


def test_non_finite_values_show_as_strings():
    a = np.ones(1000, dtype=np.float32)
    a[3] = np.nan
    assert array_stats(a)["Max"] == "nan"
    a[3] = -np.inf
    rec = array_stats(a)
    assert rec["Min"] == "-inf" and rec["Mean"] == "-inf" and rec["Max"] == 1.0


def test_tensors_read_in_place_give_the_asnumpy_statistics():
    """CPU float tensors are summarised from their own memory (data_ptr, strides), views included:
    the same numbers, bit for bit, as the statistics of asnumpy()'s copy."""
    ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
    from mindspore import mint

    from msprobe.mindspore.statistics import Summarizer, direct_moments

    kinds = Summarizer()._direct
    assert kinds, "the CPU build reads float tensors in place"
    base = mint.mul(ms.Tensor(np.random.default_rng(5).standard_normal((4, 32, 384)).astype(np.float32)), 1.5)
    q, k, v = mint.chunk(base, 3, -1)
    views = {"dense": base, "chunk": k, "last chunk": v, "row": base[1], "transpose": base.transpose(0, 2, 1),
             "heads": q.reshape(4, 32, 4, 32).transpose(0, 2, 1, 3), "broadcast": mint.broadcast_to(base[0, :1], (8, 384)),
             "float64": base.astype(ms.float64).transpose(1, 0, 2)}
    assert not k.is_contiguous() and not views["broadcast"].is_contiguous()  # the strided path is exercised
    for name, t in views.items():
        assert direct_moments(t, kinds[t.dtype]) is not None, name  # read in place
        rec = Summarizer().summarize(t)[0]
        assert {s: rec[s] for s in ("Max", "Min", "Mean", "Norm")} == array_stats(t.asnumpy()), name
    assert ms.float16 not in kinds  # other dtypes: asnumpy() and numpy
    inf = mint.mul(base, float("inf"))
    assert direct_moments(inf, kinds[inf.dtype]) is None and array_stats(inf.asnumpy())["Max"] == "inf"
    assert Summarizer().summarize(inf)[0]["Max"] == "inf"


def test_md5_reads_tensors_in_place_too(monkeypatch):
    """With md5 a CPU float tensor is read where it lies as well (no asnumpy() copy): the CRC-32 of its
    memory, or of its values in index order for a view, and the statistics the statistics task gives."""
    ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
    import zlib

    from mindspore import mint

    from msprobe.core import checksum
    from msprobe.mindspore import statistics

    base = mint.mul(ms.Tensor(np.random.default_rng(6).standard_normal((4, 32, 96)).astype(np.float32)), 1.5)
    views = {"dense": base, "chunk": mint.chunk(base, 3, -1)[1], "transpose": base.transpose(0, 2, 1),
             "float64": base.astype(ms.float64)}
    want = {name: (statistics.Summarizer().summarize(t)[0], np.ascontiguousarray(t.asnumpy()).tobytes())
            for name, t in views.items()}

    def no_copy(t):
        raise AssertionError("asnumpy() copy of a tensor the kernel reads in place")
    monkeypatch.setattr(statistics, "host_view", no_copy)
    copies, dense_copy = [], statistics._dense_copy
    monkeypatch.setattr(statistics, "_dense_copy", lambda t, dt: copies.append(t) or dense_copy(t, dt))
    # C-order copies: the chunk's statistics (its CRC reads its 128-byte runs in place), the transpose's
    # statistics and CRC (runs of one element)
    made = {"dense": 0, "chunk": 1 if checksum.NATIVE else 2, "transpose": 2, "float64": 0}
    for name, t in views.items():
        copies.clear()
        rec = statistics.Summarizer(md5=True).summarize(t)[0]
        stats, raw = want[name]
        assert rec == {**stats, "md5": f"{zlib.crc32(raw):08x}"}, name
        assert list(rec) == [*stats, "md5"], name
        assert len(copies) == made[name], name


def test_what_the_flusher_may_read_it_reads_without_an_op(monkeypatch):
    """The flusher thread summarises the waiting tensors while the training thread is idle only where no
    MindSpore op runs (Summarizer.reads_without_op): float32/float64 in any layout, inf and nan included
    (copied from their memory, as asnumpy() would order them), other dtypes when contiguous, and a
    strided float view whose values also go to a tensor file not at all."""
    ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
    from mindspore import mint

    from msprobe.mindspore import statistics

    a = np.random.default_rng(7).standard_normal((6, 8)).astype(np.float32)
    a[1, 2], a[3, 0] = np.nan, np.inf
    base = mint.mul(ms.Tensor(a), 1.0)
    cases = {"strided float with nan": base.transpose(1, 0), "strided float64": base.astype(ms.float64).transpose(1, 0),
             "int32": ms.Tensor(np.arange(12, dtype=np.int32).reshape(3, 4))}
    want = {name: statistics.Summarizer(md5=True).summarize(t)[0] for name, t in cases.items()}
    for name, t in cases.items():  # what asnumpy()'s copy gives
        values = np.ascontiguousarray(t.asnumpy())
        assert want[name] == {**want[name], **array_stats(values), "md5": statistics.checksum_of(values)}, name
    s = statistics.Summarizer(md5=True)
    assert all(s.reads_without_op(t) for t in cases.values())
    assert not s.reads_without_op(cases["strided float with nan"], saved=True)
    assert not s.reads_without_op(ms.Tensor(a).astype(ms.bfloat16))
    assert not s.reads_without_op(cases["int32"].transpose(1, 0))

    def no_op(*args):
        raise AssertionError("asnumpy() of a strided view: a MindSpore op")
    real = statistics.host_view
    monkeypatch.setattr(statistics, "host_view", lambda t: no_op() if not t.is_contiguous() else real(t))
    for name, t in cases.items():
        assert statistics.Summarizer(md5=True).summarize(t)[0] == want[name], name

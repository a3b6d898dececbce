"""Summarizer: statistics against torch's own reductions, memory-keyed reuse, the CRC-32 checksum."""

import json
import os
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
import torch

from msprobe.core.dump import moments as native
from msprobe.core.dump.json_append import JsonAppendFile
from msprobe.core.dump.tensor_files import link_file, load_tensor_file, write_npy
from msprobe.pytorch.summary.host import crc32_of
from msprobe.pytorch.summary.layout import memory_order
from msprobe.pytorch.summary.summarizer import Summarizer
from msprobe_test_models import assert_stats  # loaded by conftest.py

pytestmark = pytest.mark.usefixtures("host_path")  # (conftest.py)


@pytest.mark.parametrize("make", [
    lambda: torch.randn(7, 5),
    lambda: torch.randn(4, 6, 8).transpose(0, 2),          # permutation of a dense layout
    lambda: torch.randn(10, 10)[::2, 1:],                    # not dense: reduced as it is
    lambda: (torch.randn(64, 3) * 100).to(torch.bfloat16).t(),
    lambda: torch.randn(5, 3).to(torch.float16),
])
def test_float_statistics_match_torch(make):
    t = make()
    rec, _ = Summarizer().summarize(t)
    assert_stats(rec, t, rel=1e-5)


def test_float64_statistics_in_float64():
    t = torch.randn(3, 4, dtype=torch.float64)
    rec, _ = Summarizer().summarize(t)
    assert (rec["Max"], rec["Min"]) == (t.max().item(), t.min().item())
    assert rec["Mean"] == pytest.approx(t.mean().item(), rel=1e-12)
    assert rec["Norm"] == pytest.approx(t.norm().item(), rel=1e-12)


def test_memory_order_makes_transposes_contiguous_without_copy():
    x = torch.randn(2, 3, 4, 5)
    y = memory_order(x.permute(2, 0, 3, 1))
    assert y.is_contiguous() and y.data_ptr() == x.data_ptr()
    z = x[:, ::2]
    assert memory_order(z) is z


def test_integer_bool_empty_and_nonfinite():
    s = Summarizer()
    rec, _ = s.summarize(torch.tensor([[1, -5], [7, 2]]))
    assert (rec["Max"], rec["Min"], rec["Mean"]) == (7, -5, 1.25)
    assert rec["Norm"] == pytest.approx((1 + 25 + 49 + 4) ** 0.5)
    rec, _ = s.summarize(torch.tensor([True, False]))
    assert (rec["Max"], rec["Min"], rec["Mean"], rec["Norm"]) == (True, False, None, None)
    rec, _ = s.summarize(torch.empty(0, 3))
    assert rec["Max"] is None and rec["Norm"] is None
    rec, _ = s.summarize(torch.tensor([1.0, float("inf"), -2.0]))
    assert (rec["Max"], rec["Min"], rec["Mean"], rec["Norm"]) == ("inf", -2.0, "inf", "inf")
    rec, _ = s.summarize(torch.tensor([1.0, float("nan")]))
    assert rec["Max"] == "nan" and rec["Mean"] == "nan"
    # squares overflow float32 although every value is finite: the norm is still right
    big = torch.full((4,), 3e30)
    rec, _ = s.summarize(big)
    assert rec["Norm"] == pytest.approx(6e30, rel=1e-6) and rec["Mean"] == pytest.approx(3e30, rel=1e-6)


def test_reuse_is_keyed_by_memory_and_version():
    s = Summarizer()
    x = torch.randn(6, 4)
    rec1, entry1 = s.summarize(x)
    rec2, entry2 = s.summarize(x.detach())  # another tensor object over the same memory
    assert entry2 is entry1 and rec2 == rec1
    x.mul_(2)  # version bump: computed again
    rec3, entry3 = s.summarize(x)
    assert entry3 is not entry1 and rec3["Max"] == pytest.approx(2 * rec1["Max"])
    s.forget([x])
    _, entry5 = s.summarize(x)
    assert entry5 is not entry3
    # a slice is other elements: its own entry
    _, entry6 = s.summarize(x[1:3])
    assert entry6 is not entry5


def test_same_tensor_object_reuses_its_record_until_it_changes():
    s = Summarizer()
    x = torch.randn(6, 4)
    rec1, entry1 = s.summarize(x)
    rec2, entry2 = s.summarize(x)  # the same object again: its own record, equal, not the same dict
    assert entry2 is entry1 and rec2 == rec1 and rec2 is not rec1 and rec2["shape"] == [6, 4]
    rec2["data_name"] = "x.npy"  # what a caller adds stays in its own record
    assert "data_name" not in s.summarize(x)[0]
    x.requires_grad_()
    assert s.summarize(x)[0]["requires_grad"] is True
    with torch.no_grad():
        x.add_(1)  # version bump
    rec3, entry3 = s.summarize(x)
    assert entry3 is not entry1 and rec3["Min"] == pytest.approx(rec1["Min"] + 1, rel=1e-6)
    y = torch.randn(2, 3)
    ry, _ = s.summarize(y)
    y.data = torch.full((2, 3), 5.0)  # new memory behind the same object, version kept
    ry2, _ = s.summarize(y)
    assert ry2["Max"] == ry2["Min"] == 5.0 and ry["Max"] != 5.0
    y.data = y.data.view(3, 2)  # the same memory in another shape
    assert s.summarize(y)[0]["shape"] == [3, 2]
    s.forget([y])  # written behind autograd's back (a collective): read again
    y.data.copy_(torch.full((3, 2), 7.0))
    assert s.summarize(y)[0]["Max"] == 7.0


@pytest.mark.parametrize("native_record", ["1", "0"], ids=["C path", "Python path"])
@pytest.mark.parametrize("change", ["data.add_", "data.copy_", "detach().mul_"])
def test_a_parameter_changed_through_another_tensor_object_is_read_again(tmp_path, monkeypatch, native_record,
                                                                          change):
    """`p.data.add_(...)` (old-style optimizers, EMA updates) changes p's memory through a tensor with a
    version counter of its own: p's next record in the step must hold the new values, not its first."""
    from msprobe.pytorch import PrecisionDebugger

    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", native_record)
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L1", "dump_path": str(tmp_path / "out")}))
    dbg = PrecisionDebugger(config_path=str(cfg))
    lin = torch.nn.Linear(4, 4)  # its init left the weight at version 1: a coincidence the check must survive
    x = torch.randn(2, 4)
    dbg.start()
    torch.nn.functional.linear(x, lin.weight)
    for _ in range(2):
        if change == "data.add_":
            lin.weight.data.add_(100.0)
        elif change == "data.copy_":
            lin.weight.data.copy_(lin.weight.data + 100.0)
        else:
            lin.weight.detach().mul_(3.0)
        torch.nn.functional.linear(x, lin.weight)
    want = lin.weight.max().item()
    dbg.stop()
    dbg.step()
    dbg.close()
    (dump,) = list((tmp_path / "out").rglob("dump.json"))
    data = json.loads(dump.read_text())["data"]
    maxima = [data[f"Functional.linear.{i}.forward"]["input_args"][1]["Max"] for i in range(3)]
    assert maxima[2] == pytest.approx(want, rel=1e-6)
    assert len(set(maxima)) == 3  # each read after its change


def test_shared_records_are_one_dict_per_unchanged_tensor(tmp_path):
    """`shared=True` (what the session asks for records it only hands on): the same unchanged tensor gives
    the same dict, built once, not one per record; a caller that extends its record gets its own."""
    s = Summarizer(md5=True)
    x = torch.randn(6, 4)
    rec1, entry = s.summarize(x, shared=True)
    rec2, _ = s.summarize(x, shared=True)
    assert type(rec1) is dict and rec2 is rec1
    want = s.summarize(x)[0]  # a caller that extends its record gets a dict of its own
    assert type(want) is dict and want is not rec1 and rec1 == want and list(want)[-1] == "requires_grad"
    assert list(want) == ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "md5", "requires_grad"]
    x.requires_grad_()  # the same memory, another flag: another record, the shared one unchanged
    rec3, _ = s.summarize(x, shared=True)
    assert rec3 is not rec1 and rec3 == dict(want, requires_grad=True) and rec1 == want
    assert list(rec3) == list(want)
    f = JsonAppendFile(str(tmp_path / "d.json"), finite=True)
    f.append_many([("a", {"output": [rec1, None, rec3]})])
    f.append("b", [rec1, 2 ** 70])  # json's path (an int beyond 64 bits)
    f.close()
    with open(tmp_path / "d.json", encoding="utf-8") as fh:
        got = json.load(fh)
    assert got == {"a": {"output": [want, None, dict(want, requires_grad=True)]}, "b": [want, 2 ** 70]}


def test_views_over_the_same_memory_share_statistics_with_their_own_shape():
    s = Summarizer()
    x = torch.randn(2, 3, 4)
    rec, entry = s.summarize(x)
    for view in (x.view(24), x.reshape(6, 4), x.transpose(0, 2), x.permute(1, 0, 2), x.flatten(1)):
        vrec, ventry = s.summarize(view)
        assert ventry is entry and vrec["shape"] == list(view.shape)
        fresh, _ = Summarizer().summarize(view.clone())
        for field in ("Max", "Min", "Mean", "Norm"):
            assert vrec[field] == pytest.approx(fresh[field], rel=1e-6)
    # views of a slice: the same elements as the slice, not as the tensor it was cut from
    qkv = torch.randn(2, 5, 12)
    q = qkv.chunk(3, dim=-1)[0]
    qrec, qentry = s.summarize(q)
    for view in (q.view(2, 5, 2, 2), q.view(2, 5, 2, 2).transpose(1, 2), q.transpose(0, 1)):
        vrec, ventry = s.summarize(view)
        assert ventry is qentry and vrec["Norm"] == pytest.approx(float(q.norm()), rel=1e-6)
    _, wentry = s.summarize(qkv)
    assert wentry is not qentry
    e = torch.randn(3, 1).expand(3, 4)  # each element four times: other sums than the column itself
    erec, eentry = s.summarize(e)
    assert erec["Mean"] == pytest.approx(float(e.mean()), rel=1e-6)
    assert s.summarize(e[:, :1])[1] is not eentry
    # md5 reads a permuted view's bytes in element order: a transpose is checksummed on its own
    m = Summarizer(md5=True)
    rec, entry = m.summarize(x)
    vrec, ventry = m.summarize(x.view(6, 4))
    assert ventry is entry and vrec["md5"] == rec["md5"]
    trec, tentry = m.summarize(x.transpose(0, 2))
    assert tentry is not entry and trec["md5"] == reference_checksum(x.transpose(0, 2))
    # a saved file is reused only by a tensor laid out the same way
    entry.set_file(x, "x.npy")
    assert entry.file_for(x.detach()) == "x.npy" and entry.file_for(x.view(24)) is None


def test_reuse_never_outlives_the_tensor():
    s = Summarizer()
    rec, _ = s.summarize(torch.ones(1000))
    # the first tensor is gone: a new one, possibly at the same address, is computed afresh
    rec2, _ = s.summarize(torch.full((1000,), 3.0))
    assert rec2["Max"] == 3.0


def reference_checksum(x):
    """What msProbe writes: zlib's CRC-32 of the tensor's bytes in index order, 8 hex digits."""
    raw = x.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return f"{zlib.crc32(raw):08x}"


def test_checksum_of_tensors_in_place_and_of_views():
    x = torch.randn(600_000)
    assert crc32_of(x) == reference_checksum(x) == f"{zlib.crc32(x.numpy().tobytes()):08x}"
    tail = x[5:]  # contiguous, at an offset into its storage: its own bytes only
    assert crc32_of(tail) == reference_checksum(tail) != crc32_of(x)
    xt = torch.randn(700, 500).t()  # not contiguous: the bytes in index order
    assert crc32_of(xt) == crc32_of(xt.contiguous()) == reference_checksum(xt)
    s = Summarizer(md5=True)
    rec, _ = s.summarize(torch.arange(6, dtype=torch.bfloat16))
    assert rec["md5"] == reference_checksum(torch.arange(6, dtype=torch.bfloat16)) and len(rec["md5"]) == 8
    assert s.summarize(torch.empty(0))[0]["md5"] == "00000000"  # zlib.crc32(b"")
    # leading zeros count (the CRC's initial value): zero tensors of different lengths differ
    assert crc32_of(torch.zeros(3)) != crc32_of(torch.zeros(4))
    # one bit, or two words swapped, change it
    y = x.clone()
    y.view(torch.int32)[7] ^= 1
    z = x.clone()
    z[[3, 4]] = x[[4, 3]]
    assert len({crc32_of(x), crc32_of(y), crc32_of(z)}) == 3
    # a conjugate or negative view is checksummed as the values it shows
    c = torch.randn(5, dtype=torch.complex64)
    assert crc32_of(c.conj()) == reference_checksum(c.conj().resolve_conj())


def _long_run_views():
    """Views whose index order is dense runs of 64 bytes or more (attention's q/k/v chunks and heads, a
    gapped slice, an expanded row, an offset block), and views of shorter runs, which are copied."""
    qkv = torch.randn(4, 32, 3 * 256)
    q, k, _ = qkv.chunk(3, dim=-1)
    long_runs = [q, q.reshape(4, 32, 4, 64).transpose(1, 2), k.reshape(4, 32, 16, 16).transpose(1, 2),
                 torch.randn(8, 9, 40)[:, ::2], torch.randn(1, 100).expand(7, 100), torch.randn(50, 60)[3:40, 8:50],
                 torch.randn(3, 5, 7, 32, dtype=torch.float64).permute(1, 0, 2, 3), torch.randn(1, 6, 1, 48)[:, 1:],
                 torch.randn(2, 200, 64).to(torch.bfloat16)[:, ::3]]
    short_runs = [torch.randn(6, 5).t(), torch.randn(4, 32, 12)[..., :3], torch.randn(3, 1).expand(3, 5)]
    return long_runs, short_runs


def test_views_are_checksummed_in_place_as_their_runs_in_index_order(monkeypatch):
    """A view whose elements are dense runs of 64 bytes or more is read in place, run after run in index
    order (msprobe._crc): zlib's CRC of its contiguous copy, with no copy made; shorter runs are copied."""
    from msprobe.core import checksum
    from msprobe.pytorch.summary import host
    if not checksum.NATIVE:
        pytest.skip("msprobe._crc not built (no C compiler), or no CRC library found")
    long_runs, short_runs = _long_run_views()
    want = [reference_checksum(t) for t in long_runs + short_runs]
    copied = []
    real_copy = host.host_copy
    monkeypatch.setattr(host, "host_copy", lambda t: copied.append(t) or real_copy(t))
    assert [crc32_of(t) for t in long_runs + short_runs] == want
    assert len(copied) == len(short_runs) and all(a is b for a, b in zip(copied, short_runs))
    for t in short_runs:
        assert checksum.crc32_hex_strided(t.data_ptr(), t.element_size(), t.shape, t.stride()) is None


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_large_reads_split_over_threads_join_to_zlibs_crc(threads):
    """A large read cut into one stretch a thread (mid-run, across runs), the parts joined with zlib's
    crc32_combine64: zlib's CRC of the whole, contiguous or a view, whatever the number of threads."""
    from msprobe.core import checksum
    if not checksum.NATIVE:
        pytest.skip("msprobe._crc not built (no C compiler), or no CRC library found")
    x = torch.randn(1_000_003)
    assert checksum.crc32_hex_at(x.data_ptr(), x.numel() * 4, threads) == reference_checksum(x)
    wide = torch.randn(512, 3 * 700)
    for t in (wide[:, 700:1400], wide[:, 5:].reshape(512, 5, 419).transpose(0, 1)):
        got = checksum.crc32_hex_strided(t.data_ptr(), 4, t.shape, t.stride(), threads)
        assert got == reference_checksum(t)


def test_checksums_without_the_native_crc_are_the_same():
    """MSPROBE_NATIVE_CRC=0 (or no msprobe._crc): copies and the library's Python function give the
    same digits."""
    code = ("import torch, zlib\n"
            "from msprobe.core import checksum\n"
            "from msprobe.pytorch.summary.host import crc32_of\n"
            "assert not checksum.NATIVE\n"
            "x = torch.arange(3 * 4 * 96, dtype=torch.float32).reshape(3, 4, 96)[:, :, 10:90].transpose(0, 1)\n"
            "print(crc32_of(x), f'{zlib.crc32(x.contiguous().numpy().tobytes()):08x}')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MSPROBE_NATIVE_CRC": "0"})
    assert done.returncode == 0, done.stderr
    got, want = done.stdout.split()
    assert got == want


def test_write_npy_and_link(tmp_path):
    for a in [np.random.randn(3, 4).astype(np.float32), np.array(5.0), np.zeros((0, 3)), np.random.randn(5, 6).T,
              np.array([True, False])]:
        p = tmp_path / "x.npy"
        write_npy(p, a)
        back = load_tensor_file(p).array
        assert back.dtype == a.dtype and back.shape == a.shape and (back == a).all()
    dst = tmp_path / "y.npy"
    assert link_file(tmp_path / "x.npy", dst)
    assert os.path.samefile(tmp_path / "x.npy", dst)
    assert link_file(tmp_path / "x.npy", dst)  # replaces an existing file


def test_tensors_without_storage_are_summarised_uncached():
    from torch._subclasses.fake_tensor import FakeTensorMode
    s = Summarizer(stats=False)
    with FakeTensorMode():
        fake = torch.empty(3, 4)
    rec, entry = s.summarize(fake)
    assert entry is None and rec["shape"] == [3, 4] and rec["dtype"] == "torch.float32"
    s.forget([fake])


def test_one_pass_kernel_agrees_with_torch_reductions():
    fused, reference = Summarizer(), Summarizer()
    reference._native_kinds = {}  # torch's aminmax/sum/dot, as on a machine without the kernel
    torch.manual_seed(0)
    base = torch.randn(4, 128, 768)
    cases = [base.chunk(3, dim=-1)[1], base.chunk(3, dim=-1)[2].reshape(4, 128, 4, 64).transpose(1, 2),
             torch.randn(100).as_strided((3, 10), (5, 1)),  # overlapping windows
             torch.randn(1, 256).expand(4, 256), torch.randn(64, 64)[:, 3],
             torch.randn(3, 5), torch.randn(300, 700).t(), torch.randn(1_000_000) * 4 + 1,
             torch.randn(64, 64, dtype=torch.float64), torch.randn(4096).bfloat16(), torch.randn(17)[3:]]
    for t in cases:
        a, b = fused._stats(t), reference._stats(t)
        assert a["Max"] == b["Max"] and a["Min"] == b["Min"]
        # against float64 truth: the kernel sums in double (then rounds to float32; the layouts it leaves
        # to torch are small here); torch's float32 reductions drift further on large strided tensors
        exact = t.double()
        mean, norm = float(exact.mean()), float(exact.norm())
        assert a["Mean"] == pytest.approx(mean, rel=1e-6, abs=1e-6 * float(exact.abs().max()))
        assert a["Norm"] == pytest.approx(norm, rel=1e-6)
        assert b["Mean"] == pytest.approx(mean, rel=1e-4, abs=1e-5)
        assert b["Norm"] == pytest.approx(norm, rel=1e-4)
    # NaN / inf: the kernel steps aside and torch's semantics show
    x = torch.randn(1000)
    x[10] = float("nan")
    assert fused._stats(x)["Max"] == "nan"
    x[10] = float("inf")
    assert fused._stats(x)["Max"] == "inf" and fused._stats(x)["Mean"] == "inf"


def test_small_and_large_integer_tensors_agree_with_float64():
    s = Summarizer()
    for t in (torch.tensor(7), torch.randint(-100, 100, (40,)), torch.randint(0, 2 ** 40, (5,)),
              torch.randint(-5, 5, (3, 4)).t(), torch.randint(0, 9, (5000,)), torch.tensor([1, 2], dtype=torch.uint8)):
        rec = s._stats(t)
        exact = t.double()
        assert rec["Max"] == int(t.max()) and rec["Min"] == int(t.min())
        assert rec["Mean"] == pytest.approx(float(exact.mean()), rel=1e-12)
        assert rec["Norm"] == pytest.approx(float(exact.norm()), rel=1e-12)


@pytest.mark.parametrize("make, kernel_reads", [
    (lambda: torch.randint(0, 32_000, (4, 128)), True),  # token ids
    (lambda: torch.arange(128).expand(4, 128), False),  # positions (stride 0: torch's reductions)
    (lambda: torch.randint(-7, 7, (64, 96), dtype=torch.int32).t(), True),  # transposed: one dense run
    (lambda: torch.randint(-9, 9, (8, 30)).chunk(3, dim=1)[1], True),  # rows of a wider tensor
    (lambda: torch.randint(0, 1000, (600_000,)), True),  # split over threads
    (lambda: torch.tensor([2 ** 60, -3, 7] * 40), False),  # beyond 2^53: torch's reductions, exact
    (lambda: torch.randint(0, 5, (100,), dtype=torch.int16), False),  # a dtype the kernel does not read
], ids=["ids", "positions", "int32_transposed", "chunk", "large", "beyond_2_53", "int16"])
def test_integer_statistics_of_the_kernel_are_torchs(make, kernel_reads, monkeypatch):
    """Integer tensors (the int64 and int32 the kernel reads) give the record torch's reductions give:
    ints for Max and Min, the float64 Mean and Norm."""
    fused, reference = Summarizer(), Summarizer()
    reference._native_kinds = {}
    t = make()
    b = reference._stats(t)
    reductions = []
    aminmax = torch.aminmax
    monkeypatch.setattr(torch, "aminmax", lambda *a, **k: reductions.append(1) or aminmax(*a, **k))
    a = fused._stats(t)
    assert not reductions if kernel_reads else reductions
    assert a == b and type(a["Max"]) is int and type(a["Min"]) is int
    assert (a["Max"], a["Min"]) == (int(t.max()), int(t.min()))
    rec = fused.record(t, shared=False)  # the C path's record (msprobe._record) too
    assert {k: rec[k] for k in a} == a and type(rec["Max"]) is int


def test_kernel_threads_are_torchs_own_openmp_pool():
    """Built with OpenMP, the kernel must run on the libgomp torch loaded, not a second runtime whose
    threads would fight torch's spinning workers; its 2-thread results equal the 1-thread ones."""
    if not native._openmp:
        pytest.skip("msprobe._moments was built without OpenMP (own threads, no runtime to share)")
    code = textwrap.dedent("""
        import torch, msprobe.core.dump.moments as native
        torch.set_num_threads(2)
        x = torch.nn.functional.conv2d(torch.randn(8, 3, 64, 64), torch.randn(16, 3, 3, 3))
        one = native.moments(x.data_ptr(), x.numel(), 0, threads=1)
        two = native.moments(x.data_ptr(), x.numel(), 0, threads=2)
        assert one[:2] == two[:2] and abs(one[2] - two[2]) <= 1e-6 * abs(one[3]), (one, two)
        gomp = {line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line}
        print(len(gomp), sorted(gomp))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("1 "), out.stdout


def test_kernel_splits_only_tensors_of_parallel_min_elements_or_more(monkeypatch):
    """Handing a small read to torch's OpenMP team saves less than it costs: tensors just under
    host.PARALLEL_MIN elements (a dense one, a transpose) take one kernel thread, only tensors of
    PARALLEL_MIN elements or more are split over torch's threads."""
    from msprobe.pytorch.summary import host, summarizer
    if host.kernel is None:
        pytest.skip("msprobe._moments is not built")
    asked = []

    def counting(real):
        def kernel(address, count, kind, threads, *rows):
            asked.append(threads)
            return real(address, count, kind, threads, *rows)
        return kernel

    # the Python path's kernel calls, counted (the C path, msprobe._record, reads only tensors under
    # PARALLEL_MIN elements, on one thread: tests/pytorch/test_native_record.py)
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "0")
    monkeypatch.setattr(host, "kernel", counting(host.kernel))
    monkeypatch.setattr(summarizer, "_kernel", counting(summarizer._kernel))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        s = Summarizer()
        rows = host.PARALLEL_MIN // 256 - 1
        for t in (torch.randn(rows, 256), torch.randn(rows, 256).t(), torch.randn(64, 64)):
            s.summarize(t)
        assert asked == [1, 1, 1]
        s.summarize(torch.ones(host.PARALLEL_MIN))
        assert asked[-1] == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("device_path", ["0", "1"], ids=["host", "device_path"])
@pytest.mark.parametrize("task,summary_mode", [("statistics", "md5"), ("tensor", "statistics")])
def test_a_quantized_tensor_is_dumped_as_the_values_it_stands_for(tmp_path, monkeypatch, task, summary_mode,
                                                                   device_path):
    """torch's reductions, the device kernels and numpy take no quantized dtype: a qint8 argument used to
    end the training step with a RuntimeError from inside the dump. Its statistics (and its saved array)
    are those of the float values it stands for, read on the host; its checksum is of its own bytes."""
    from msprobe.pytorch import PrecisionDebugger

    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", device_path)

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": task, "level": "L1", "dump_path": str(tmp_path / "dump"),
                                  task: {"summary_mode": summary_mode}}))
    debugger = PrecisionDebugger(config_path=str(config))
    model = torch.nn.Linear(4, 4)
    q = torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 0, torch.qint8)
    debugger.start(model)
    model(q.dequantize()).sum().backward()
    debugger.stop()
    debugger.step()
    debugger.close()
    (dump,) = (tmp_path / "dump").rglob("dump.json")
    rec = json.loads(dump.read_text())["data"]["Tensor.dequantize.0.forward"]["input_args"][0]
    values = q.dequantize().double()
    assert rec["dtype"] == "torch.qint8" and rec["shape"] == [4, 4]
    assert (rec["Max"], rec["Min"]) == (values.max().item(), values.min().item())
    assert rec["Norm"] == pytest.approx(values.norm().item(), rel=1e-6)
    if summary_mode == "md5":
        assert rec["md5"] == f"{zlib.crc32(q.int_repr().numpy().tobytes()):08x}"
    else:
        saved = np.load(next(dump.parent.rglob(rec["data_name"])))
        assert saved.dtype == np.float32 and np.array_equal(saved, q.dequantize().numpy())


@pytest.mark.parametrize("device_path", ["0", "1"], ids=["host", "device_path"])
def test_sparse_and_mkldnn_tensors_are_summarised_as_the_dense_ones(monkeypatch, device_path):
    """A sparse tensor (COO, uncoalesced: duplicate indices sum; CSR; all stored; none stored) and an
    mkldnn one give the statistics and checksum of the dense tensor they stand for, on either path; a
    sparse one without densifying it for its statistics."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", device_path)
    gen = torch.Generator().manual_seed(3)
    dense = torch.zeros(6, 5)
    dense[1, 2], dense[4, 0], dense[5, 4] = 2.5, -1.25, 0.5
    coo = torch.sparse_coo_tensor(torch.tensor([[1, 4, 5, 1], [2, 0, 4, 2]]), torch.tensor([2.0, -1.25, 0.5, 0.5]),
                                  (6, 5))  # (1, 2) stored twice: 2.0 + 0.5
    positive = torch.rand(3, 4, generator=gen) + 0.5
    cases = [(coo, dense), (dense.to_sparse_csr(), dense), (positive.to_sparse(), positive),
             (torch.sparse_coo_tensor(torch.empty(2, 0, dtype=torch.long), torch.empty(0), (3, 3)), torch.zeros(3, 3)),
             (positive.to_mkldnn(), positive)]
    for t, want in cases:
        got = Summarizer(md5=True).summarize(t)[0]
        s = Summarizer(md5=True)
        expected = s.summarize(want.clone())[0]
        s.start_resolve().finish()
        if device_path == "0":  # (Mean: the stored values' double sum, the kernel's blocked one)
            assert {**got, "Mean": None} == {**expected, "Mean": None}, t.layout
            assert got["Mean"] == pytest.approx(expected["Mean"], rel=1e-6), t.layout
        else:
            x = want.double()
            assert (got["Max"], got["Min"]) == (x.max().item(), x.min().item()), t.layout
            assert got["Mean"] == pytest.approx(x.mean().item(), abs=1e-7) and got["md5"] == expected["md5"]
        assert got["md5"] == reference_checksum(want) and got["shape"] == list(want.shape)


def test_an_embeddings_sparse_gradient_is_dumped_at_every_level(tmp_path):
    """nn.Embedding(sparse=True) hands the optimizer a sparse gradient: it used to end the step with a
    NotImplementedError from the dump (torch's reductions take no sparse tensor). Its records hold the
    statistics of the dense gradient it stands for."""
    from msprobe.pytorch import PrecisionDebugger

    for level in ("L0", "L1", "mix"):
        config = tmp_path / f"{level}.json"
        config.write_text(json.dumps({"task": "statistics", "level": level, "dump_path": str(tmp_path / level),
                                      "statistics": {"summary_mode": "md5"}}))
        debugger = PrecisionDebugger(config_path=str(config))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(50, 8, sparse=True), torch.nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        debugger.start(model)
        model(torch.tensor([[1, 7, 7], [3, 1, 9]])).sum().backward()
        grad = model[0].weight.grad.to_dense()
        opt.step()
        debugger.stop()
        debugger.step()
        debugger.close()
        (dump,) = (tmp_path / level).rglob("dump.json")
        data = json.loads(dump.read_text())["data"]
        if level == "L1":
            continue  # no parameter gradient records at L1
        (key,) = [k for k in data if k.startswith("Module.0.Embedding.parameters_grad.")]
        (rec,) = data[key]["weight"]  # (a parameter's records: a list)
        x = grad.double()
        assert (rec["Max"], rec["Min"], rec["shape"]) == (x.max().item(), x.min().item(), [50, 8]), level
        assert rec["Mean"] == pytest.approx(x.mean().item(), rel=1e-5) and rec["md5"] == reference_checksum(grad)


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_nested_tensors_of_the_transformer_encoders_fast_path_are_dumped(tmp_path, task):
    """nn.TransformerEncoder in eval with a padding mask runs its layers on nested tensors (its fast
    path): at L0 every layer's record used to end the forward with "NestedTensorImpl doesn't support
    sizes". A nested tensor's record holds the statistics of its components' elements and the padded
    shape; tensor mode saves the padded tensor."""
    from msprobe.pytorch import PrecisionDebugger

    torch.manual_seed(0)
    encoder = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2).eval()
    x = torch.randn(3, 5, 16)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[0, 3:] = True
    seen = []
    encoder.layers[0].register_forward_hook(lambda m, a, out: seen.append(out))
    debugger = PrecisionDebugger(task=task, level="L0", dump_path=str(tmp_path))
    with torch.no_grad():
        debugger.start(encoder)
        encoder(x, src_key_padding_mask=mask)
        debugger.stop()
        debugger.step()
    debugger.close()
    (out,) = seen
    assert out.is_nested  # the fast path was taken
    elements = torch.cat([c.reshape(-1) for c in out.unbind()]).double()
    (dump,) = tmp_path.rglob("dump.json")
    (rec,) = json.loads(dump.read_text())["data"]["Module.layers.0.TransformerEncoderLayer.forward.0"]["output"]
    assert rec["shape"] == [3, 5, 16] and rec["dtype"] == "torch.float32"
    assert (rec["Max"], rec["Min"]) == (elements.max().item(), elements.min().item())
    assert rec["Norm"] == pytest.approx(elements.norm().item(), rel=1e-6)
    if task == "tensor":
        saved = np.load(next(dump.parent.rglob(rec["data_name"])))
        assert np.array_equal(saved, torch.nested.to_padded_tensor(out, 0).numpy())

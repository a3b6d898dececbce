"""The one-pass statistics kernel (msprobe._moments) against numpy in float64, in each of its loops
(`kernel_loop`: portable, AVX2, AVX-512)."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from msprobe.core.dump import moments as native


def _expected(a64):
    return a64.max(), a64.min(), a64.mean(), np.sqrt((a64 * a64).sum())


def _check(got, a64, rel):
    mx, mn, mean, norm = _expected(a64)
    assert got[0] == mx and got[1] == mn  # extremes are exact
    assert got[2] == pytest.approx(mean, rel=rel, abs=rel * np.abs(a64).max())
    assert got[3] == pytest.approx(norm, rel=rel)


def test_the_kernel_is_built():
    # CI installs the project, which compiles it: a missing kernel would silently cost speed
    assert native._moments is not None and native.ENABLED, native.describe()


@pytest.mark.parametrize("n", [1, 7, 16, 17, 1000, 300_001])
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_float32_and_float64_match_numpy(n, threads, kernel_loop):
    rng = np.random.default_rng(n)
    for dtype, kind in ((np.float32, 0), (np.float64, 1)):
        a = (rng.standard_normal(n) * 3 + 0.5).astype(dtype)
        got = native.moments(a.ctypes.data, n, kind, threads)
        # float32: Mean and Norm come back rounded to float32, as torch's and numpy's reductions give them
        _check(got, a.astype(np.float64), 1e-12 if kind == 1 else 1.2e-7)
        if kind == 0:
            assert np.float32(got[2]) == got[2] and np.float32(got[3]) == got[3]


def test_unaligned_memory_and_bfloat16(kernel_loop):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(10_001).astype(np.float32)
    tail = a[1:]  # starts 4 bytes into the buffer
    _check(native.moments(tail.ctypes.data, tail.size, 0, 2), tail.astype(np.float64), 1.2e-7)
    # bfloat16 = the upper half of a float32; build exact bf16 values and their bit patterns
    bits = (a.view(np.uint32) >> 16).astype(np.uint16)
    exact = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    _check(native.moments(bits.ctypes.data, bits.size, native.KINDS["bfloat16"], 1), exact, 1.2e-7)


def test_nan_or_inf_leaves_the_decision_to_the_framework(kernel_loop):
    for n in (1000, 20_003):  # (AVX-512 reads the larger one: from 8192 elements)
        for at in (517, n - 1):  # inside the vector steps, and in the scalar tail
            for bad in (np.nan, np.inf, -np.inf):
                a = np.ones(n, dtype=np.float32)
                a[at] = bad
                assert native.moments(a.ctypes.data, a.size, 0, 1) is None, (n, at, bad)
    # finite values whose squares overflow float32 are fine: sums are in double
    big = np.full(8, 3e30, dtype=np.float32)
    got = native.moments(big.ctypes.data, 8, 0, 1)
    assert got[3] == pytest.approx(np.sqrt(8) * 3e30, rel=1e-6)
    # a Norm beyond float32's range never comes back as inf: the portable loop keeps the double,
    # the vector loops' float block sums overflow first and hand the tensor to the framework (None)
    for n in (16, 10_000):
        huge = np.full(n, 3e38, dtype=np.float32)
        got = native.moments(huge.ctypes.data, n, 0, 1)
        assert got is None or (np.isfinite(got[3]) and got[3] == pytest.approx(np.sqrt(n) * 3e38, rel=1e-6))


def test_bad_arguments_are_refused():
    a = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError, match="count and rows must be > 0"):
        native._moments(a.ctypes.data, 0, 0, 1)
    with pytest.raises(ValueError, match="kind 0..4"):
        native._moments(a.ctypes.data, 4, 7, 1)
    with pytest.raises(ValueError, match="row_stride >= count"):
        native._moments(a.ctypes.data, 2, 0, 1, 2, 1)
    with pytest.raises(TypeError, match="rows, row_stride"):
        native._moments(a.ctypes.data, 4, 0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 3, 600])
def test_rows_of_a_wider_buffer(rows, threads, kernel_loop):
    """One third of each row, as `qkv.chunk(3, -1)[0]`: only those elements are read."""
    rng = np.random.default_rng(rows)
    wide = rng.standard_normal((rows, 3 * 513)).astype(np.float32)
    wide[:, 513:] = 1e6  # the other two thirds must not show
    part = wide[:, :513]
    got = native.moments(wide.ctypes.data, 513, 0, threads, rows=rows, row_stride=3 * 513)
    _check(got, part.astype(np.float64), 1.2e-7)


@pytest.mark.parametrize("n", [1, 17, 300_001])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integers_come_back_exact_with_ints_for_max_and_min(dtype, threads, n):
    """Token ids, labels, positions: Max/Min exact and ints (a record writes 999, not 999.0), Mean and
    Norm in double as the frameworks compute them from a float64 copy (exact sums here)."""
    a = np.random.default_rng(n).integers(-50_000, 50_000, n).astype(dtype)
    got = native.moments(a.ctypes.data, n, native.KINDS[np.dtype(dtype).name], threads)
    f = a.astype(np.float64)
    assert type(got[0]) is int and type(got[1]) is int
    assert (got[0], got[1]) == (int(a.max()), int(a.min()))
    assert got[2] == f.sum() / n and got[3] == pytest.approx(np.sqrt(np.dot(f, f)), rel=1e-15)
    rows = a[: n - n % 3].reshape(-1, 3)[:, :2] if n >= 3 else None  # rows of a wider buffer
    if rows is not None:
        got = native.moments(a.ctypes.data, 2, native.KINDS[np.dtype(dtype).name], threads, rows.shape[0], 3)
        assert (got[0], got[1]) == (int(rows.max()), int(rows.min()))


def test_integers_a_double_cannot_hold_exactly_go_to_the_framework():
    exact = np.array([2 ** 53 - 1, -(2 ** 53 - 1), 5], dtype=np.int64)
    assert native.moments(exact.ctypes.data, 3, native.KINDS["int64"], 1)[:2] == (2 ** 53 - 1, -(2 ** 53 - 1))
    # 2^53 + 1 is 2^53 as a double: the Max would be off by one
    for big in (2 ** 53, 2 ** 53 + 1, -(2 ** 53) - 1, 2 ** 63 - 1, -(2 ** 63)):
        a = np.array([3, big, 4], dtype=np.int64)
        assert native.moments(a.ctypes.data, 3, native.KINDS["int64"], 1) is None


@pytest.mark.parametrize("n", [31, 32, 33, 255, 256, 257, 8191, 8192 + 31, 8192 + 64, 8192 + 65, 8192 + 511,
                               8192 + 513, 100_003])
def test_every_loop_reads_every_element_once(n):
    """The loops step 16, 32 or 64 elements at a time over float blocks of 128 to 512, with a scalar tail
    (AVX-512 from 8192 elements): an extreme placed at each edge of those steps is found, and every loop's
    sums agree with float64's."""
    if native.kernel is None:
        pytest.skip("msprobe._moments not built")
    rng = np.random.default_rng(n)
    edges = {0, 1, 15, 16, 31, 32, 63, 64, n // 2, n - 65, n - 64, n - 33, n - 32, n - 17, n - 2, n - 1}
    for at in sorted(edges & set(range(n))):
        a = rng.standard_normal(n).astype(np.float32)
        a[at] = 40.0
        a[(at + n // 3) % n] = -40.0  # (elsewhere: n // 3 is not a multiple of n)
        for level in range(native.VECTORS + 1):
            with native.using_loop(level):
                got = native.moments(a.ctypes.data, n, 0, 1)
            assert got[:2] == (40.0, -40.0), (native.LOOPS[level], at)
            _check(got, a.astype(np.float64), 1.2e-7)


def test_a_loop_this_cpu_cannot_run_is_refused():
    if native.kernel is None:
        pytest.skip("msprobe._moments not built")
    with pytest.raises(ValueError, match=f"level must be 0..{native.VECTORS} on this CPU"):
        native._use_vectors(native.VECTORS + 1)
    assert native.LOOPS[native.VECTORS] in native.describe()


# a child process: each loop reads buffers that end where a page without access begins (a read past the
# end is a segmentation fault, which the parent sees as the child's exit status)
_GUARDED_READS = textwrap.dedent("""
    import ctypes, mmap
    from msprobe.core.dump import moments as native
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    kept = []

    def ending_at_a_guard(nbytes):
        pages = (nbytes + mmap.PAGESIZE - 1) // mmap.PAGESIZE + 1
        buf = mmap.mmap(-1, pages * mmap.PAGESIZE)  # zeros
        kept.append(buf)
        guard = ctypes.addressof(ctypes.c_char.from_buffer(buf)) + (pages - 1) * mmap.PAGESIZE
        assert libc.mprotect(guard, mmap.PAGESIZE, 0) == 0
        return guard - nbytes

    for level in range(native.VECTORS + 1):
        with native.using_loop(level):
            for n in (1, 17, 8191, 8192 + 63, 100_003):
                for kind, itemsize in ((0, 4), (1, 8), (2, 2), (3, 8), (4, 4)):
                    assert native.moments(ending_at_a_guard(n * itemsize), n, kind, 2)[0] == 0
                a, b = ending_at_a_guard(n * 4), ending_at_a_guard(n * 4)
                assert native.sum_kernel((a, b), n, 2)[0] == 0
    print("read", native.VECTORS + 1, "loops")
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through libc: Linux")
def test_no_loop_reads_past_the_end_of_a_buffer():
    if native.kernel is None:
        pytest.skip("msprobe._moments not built")
    done = subprocess.run([sys.executable, "-c", _GUARDED_READS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit status {done.returncode} (-11: a read past the end)\n{done.stderr[-2000:]}"
    assert f"read {native.VECTORS + 1} loops" in done.stdout

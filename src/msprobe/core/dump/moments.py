"""One pass over a tensor's memory for Max, Min, Mean and Norm, through the optional C extension
`msprobe._moments`; `None` where it was not built (the adapters then use the framework's reductions).

Must not import torch or mindspore: callers pass the address of dense memory they keep alive.
"""

import contextlib
import os

try:
    from msprobe._moments import moments as _moments, openmp as _openmp, vectorized as _vectorized
    from msprobe._moments import moments_of_sum as _moments_of_sum, use_vectors as _use_vectors
except ImportError:  # built without a C compiler: the adapters' own reductions take over
    _moments, _moments_of_sum, _use_vectors, _openmp, _vectorized = None, None, None, 0, 0

# the kernel's loops by level; this CPU runs those up to VECTORS (the widest, chosen at import; AVX-512 reads
# buffers of 8192 elements or more, AVX2 the smaller ones: the wide loop's setup costs more than it saves there)
LOOPS = ("portable", "AVX2", "AVX-512")
VECTORS = _vectorized

# element kinds the kernel reads, by the dtype names numpy and torch give them (integers: Max and Min come
# back as ints; one beyond +-2^53, where a double is no longer exact, returns None)
KINDS = {"float32": 0, "float64": 1, "bfloat16": 2, "int64": 3, "int32": 4}


# MSPROBE_NATIVE_STATS=0 turns the kernel off (to compare against the frameworks' reductions)
ENABLED = _moments is not None and os.environ.get("MSPROBE_NATIVE_STATS", "1") != "0"
# the kernel itself, for the adapters' per-tensor hot paths (no `moments` frame); None when not ENABLED
kernel = _moments if ENABLED else None
# the same of the element-wise sum of float32 buffers, (addresses, count, threads), without the sum in memory
# (a gradient that reaches an input by several edges); None when not ENABLED
sum_kernel = _moments_of_sum if ENABLED else None
# buffers sum_kernel adds at most
SUM_MAX = 8


def moments(address, count, kind, threads=1, rows=1, row_stride=None):
    """(Max, Min, Mean, Norm) of `count` dense elements of `kind` at `address` — or of `rows` runs
    of `count` elements, `row_stride` elements apart — or None when the result is not finite (a NaN
    or inf is in there: the caller's framework then decides exactly how they show) or the kernel is
    not available."""
    if not ENABLED:
        return None
    # Mean/Norm of float32/bfloat16 come back rounded to float32 precision, as the frameworks' own
    # reductions report them: digits below that are rounding noise, and two runs (or frameworks)
    # whose inputs differ in the last bit would otherwise show relative errors that compare's
    # output-vs-input rules read as amplification.
    if rows == 1:
        return _moments(address, count, kind, threads)
    return _moments(address, count, kind, threads, rows, row_stride)


def stats_record(got):
    """The Max/Min/Mean/Norm fields of a record from what `moments` (or the kernel) returned."""
    return {"Max": got[0], "Min": got[1], "Mean": got[2], "Norm": got[3]}


def describe():
    """One line for diagnostics: which statistics kernel this process uses."""
    if _moments is None:
        return "framework reductions (msprobe._moments was not built)"
    if not ENABLED:
        return "framework reductions (MSPROBE_NATIVE_STATS=0)"
    return f"one-pass C kernel ({LOOPS[_vectorized]}, {'OpenMP' if _openmp else 'own'} threads)"


@contextlib.contextmanager
def using_loop(level):
    """The kernel runs its loop of `level` (an index of LOOPS, at most VECTORS) inside the block, in the whole
    process: tests check each loop against the others, benchmarks compare them."""
    previous = _use_vectors(level)
    try:
        yield
    finally:
        _use_vectors(previous)

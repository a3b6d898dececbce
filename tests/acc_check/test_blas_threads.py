"""acc_check keeps BLAS on one thread without restarting OpenBLAS's thread pool in forked workers.

OpenBLAS stops its pool at fork; setting its thread count again (even to 1) starts a new pool thread
that spins for its first ~0.1 s, CPU the two workers of `multi_acc_check -d 0 1` needed.
"""

import os

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from msprobe.core.acc_check.runner import one_blas_thread


def _threads():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc to count threads")
def test_forked_worker_starts_no_blas_thread():
    m = np.random.default_rng(0).random((300, 300))
    if not _blas_info():
        pytest.skip("no BLAS library that threadpoolctl controls is loaded")
    with threadpool_limits(limits=2, user_api="blas"):
        m @ m  # the pool is up
        with one_blas_thread():  # as run_multi_acc_check, before it forks
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the worker: what check_cases does
                try:
                    before = _threads()
                    with one_blas_thread():
                        m @ m
                        during = _threads()
                    os.write(write, f"{before} {during}".encode())
                finally:
                    os._exit(0)
            os.close(write)
            got = os.read(read, 64).decode()
            os.waitpid(pid, 0)
    before, during = map(int, got.split())
    assert (before, during) == (1, 1)


def test_one_blas_thread_limits_and_restores():
    if not _blas_info():
        pytest.skip("no BLAS library that threadpoolctl controls is loaded")
    with threadpool_limits(limits=2, user_api="blas"):
        with one_blas_thread():
            assert {lib["num_threads"] for lib in _blas_info()} == {1}
        assert {lib["num_threads"] for lib in _blas_info()} == {2}


def _blas_info():
    from threadpoolctl import threadpool_info
    return [lib for lib in threadpool_info() if lib["user_api"] == "blas"]

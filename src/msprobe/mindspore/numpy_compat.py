"""MindSpore 2.10's C++ argument parser initialises numpy's 1.x C API lazily, the first time a Python
scalar reaches an op (`x + 1`). Under numpy >= 2 that initialisation fails, leaves a Python error set,
and the op raises SystemError — once: later calls skip the failed initialisation and work. We take that
one failure here, at import, so neither the user's first scalar op nor msprobe's own fails.

It is taken in the argument parser only: a call whose scalar is parsed and whose next argument is
refused (TypeError) runs no op. Running one would start MindSpore's PyNative executor before the user
has configured it: its queue threads would then exist for good, and a `pynative_synchronize` (or
`launch_blocking()`) set after `import msprobe.mindspore` would no longer keep ops on the Python
thread, where they are several times slower on a few cores (see sync_execution.py).
"""

import contextlib
import io
import os
import sys

import mindspore as ms
import numpy as np


@contextlib.contextmanager
def quiet_stderr():
    """numpy prints a long 'compiled using NumPy 1.x' notice, MindSpore a C++ warning: both expected."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    old, sys.stderr = sys.stderr, io.StringIO()
    try:
        yield
    finally:
        sys.stderr = old
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def absorb_first_scalar_failure():
    if int(np.__version__.split(".", 1)[0]) < 2:
        return
    with quiet_stderr():
        try:
            ms.mint.add(ms.Tensor(np.zeros(1, np.float32)), 1, alpha="refused")
        except (SystemError, TypeError):
            pass


absorb_first_scalar_failure()

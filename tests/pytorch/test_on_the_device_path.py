"""The dump tests of tests/pytorch, run again on the accelerator's path (`MSPROBE_DEVICE_SUMMARY=1`:
statistics and checksums in device slots, launched and read back in batches), the path every GPU and NPU
run takes and the rest of the suite takes only where a test asks for it. The same assertions must hold on
it: the records, their order and values, what in-place changes, optimizers, autocast, gradient
accumulation and the backward fast path leave, and no reference cycle. (The whole of tests/pytorch holds on
it too: `MSPROBE_DEVICE_SUMMARY=1 pytest tests/pytorch`; this is the part cheap enough to run every time.)"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the repository: its conftest.py and pyproject.toml
MODULES = ["test_dump_models.py", "test_dump_levels.py", "test_hf_models.py", "test_optimizer_updates.py",
           "test_shared_weight_gradients.py", "test_backward_fast_path.py", "test_overflow_dump.py",
           "test_idle_debugger.py", "test_no_reference_cycles.py", "test_dump_l2.py"]


def test_the_dump_tests_hold_on_the_device_path():
    env = dict(os.environ, MSPROBE_DEVICE_SUMMARY="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           *(os.path.join(HERE, m) for m in MODULES)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary, summary

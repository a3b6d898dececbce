"""Importing msprobe.mindspore must not run a MindSpore op: the first op starts the PyNative executor
(with its queue threads, for good), and the user's own settings made after the import —
`pynative_synchronize`, the device — must still decide how it starts. The first scalar op under numpy 2
must work all the same (numpy_compat.py)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

_SCRIPT = textwrap.dedent("""
    import json, os
    import msprobe.mindspore
    import mindspore as ms, numpy as np
    ms.set_context(pynative_synchronize=True)
    out = ((ms.Tensor(np.ones(3, np.float32)) + 1) * 2.5).asnumpy().tolist()
    names = sorted({open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")})
    print(json.dumps({"out": out, "threads": names}))
""")


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread names come from /proc")
def test_settings_made_after_import_decide_how_ops_run():
    env = dict(os.environ, GLOG_v="3")
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["out"] == [5.0, 5.0, 5.0]  # the first scalar ops work under numpy 2
    # synchronous, as the user asked after the import: no frontend/backend/bprop queue threads
    assert not [n for n in got["threads"] if n.endswith("_queue")], got["threads"]

"""A training script that dies on its own exception in the middle of a dumped step: everything captured
before it is on disk (records and tensor files), and the only message is the user's own error.

The step is flushed by the debugger's exit hook, which runs after Python has stopped its thread pools:
the tensor files still pending then are written on the exiting thread (core/dump/writer.run_on).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPTS = {
    "pytorch": textwrap.dedent('''
        import sys
        import torch
        from torch import nn
        from msprobe.pytorch import PrecisionDebugger
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        dbg = PrecisionDebugger(dump_path=sys.argv[1], task=sys.argv[2], level="L1")
        dbg.start(net)
        y = net(torch.randn(5, 8)) * 2
        raise RuntimeError("the user's own error")
    '''),
    "mindspore": textwrap.dedent('''
        import sys
        import numpy as np
        import mindspore as ms
        from mindspore import nn
        from msprobe.mindspore import PrecisionDebugger
        ms.set_context(mode=ms.PYNATIVE_MODE)
        net = nn.SequentialCell([nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4)])
        dbg = PrecisionDebugger(dump_path=sys.argv[1], task=sys.argv[2], level="L1")
        dbg.start(net)
        y = net(ms.Tensor(np.random.randn(5, 8).astype(np.float32))) * 2
        raise RuntimeError("the user's own error")
    '''),
}
LAST_CALL = {"pytorch": "Tensor.__mul__.0.forward", "mindspore": "Tensor.__mul__.0.forward"}


@pytest.mark.parametrize("task", ["tensor", "statistics"])
@pytest.mark.parametrize("framework", ["pytorch", "mindspore"])
def test_everything_before_the_exception_is_on_disk_and_only_the_users_error_is_said(tmp_path, framework, task):
    if framework == "mindspore":
        pytest.importorskip("mindspore")
    script = tmp_path / "train.py"
    script.write_text(SCRIPTS[framework])
    dump = tmp_path / "dump"
    proc = subprocess.run([sys.executable, str(script), str(dump), task], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "RuntimeError: the user's own error"
    assert not any("msprobe" in ln or "dump error" in ln for ln in lines), proc.stderr
    (rank,) = os.listdir(dump / "step0")
    rank_dir = dump / "step0" / rank
    with open(rank_dir / "dump.json", encoding="utf-8") as f:
        data = json.load(f)["data"]
    assert list(data)[-1] == LAST_CALL[framework] and len(data) >= 4
    assert not os.path.exists(rank_dir / "dump_error_info.log")
    if task == "tensor":
        files = set(os.listdir(rank_dir / "dump_tensor_data"))
        named = {t["data_name"] for rec in data.values() for part in ("input_args", "output")
                 for t in rec[part] if isinstance(t, dict) and "data_name" in t}
        assert named and named <= files

"""A MindSpore network and the equivalent PyTorch network with the same weights and data produce L0
dumps whose statistics agree (the input of cross-framework compare): same Cell/Module keys, and
forward, backward and parameter-gradient statistics equal to float32 rounding, over two SGD steps."""

import os

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
torch = pytest.importorskip("torch")

from msprobe.core.dump.reader import DumpReader  # noqa: E402
from private_modules import load_private  # noqa: E402

mlp_twins = load_private("msprobe_test_mlp_twins", os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "compare", "mlp_twins.py"))

PID = os.getpid()


def stats_of(record):
    """Flatten a record into {path: (Max, Min, Mean, Norm)} for every tensor in it."""
    out = {}

    def walk(v, path):
        if isinstance(v, dict) and "Max" in v:
            out[path] = (v["Max"], v["Min"], v["Mean"], v["Norm"], tuple(v["shape"]))
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}.{k}")
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{path}.{i}")
    walk(record, "")
    return out


def test_mindspore_and_pytorch_statistics_agree(tmp_path):
    from msprobe.mindspore import PrecisionDebugger as MsDebugger
    from msprobe.pytorch import PrecisionDebugger as PtDebugger

    ms_net, pt_net, models = mlp_twins.twins()
    x, y = models.make_data("mlp")

    ms_dbg = MsDebugger(dump_path=str(tmp_path / "ms"), level="L0")
    models.train(ms_net, x, y, steps=2, debugger=ms_dbg)
    ms_dbg.close()

    pt_dbg = PtDebugger(dump_path=str(tmp_path / "pt"), level="L0")
    opt = torch.optim.SGD(pt_net.parameters(), lr=0.05)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(2):
        pt_dbg.start(pt_net)
        opt.zero_grad()
        loss = torch.mean((pt_net(xt) - yt) ** 2)
        loss.backward()
        opt.step()
        pt_dbg.stop()
        pt_dbg.step()
    pt_dbg.close()

    for step in (0, 1):
        m = DumpReader(os.path.join(tmp_path, "ms", f"step{step}", f"proc{PID}"))
        p = DumpReader(os.path.join(tmp_path, "pt", f"step{step}", f"proc{PID}"))
        assert m.framework == "mindspore" and p.framework == "pytorch"
        ms_keys = sorted(m.keys())
        assert ms_keys == sorted(k.replace("Module.", "Cell.", 1) for k in p.keys())
        assert len(ms_keys) == 9  # 3 Linear x (forward, backward, parameters_grad)
        compared = 0
        for key in ms_keys:
            ms_stats = stats_of(m[key])
            pt_stats = stats_of(p[key.replace("Cell.", "Module.", 1)])
            # MindSpore computes no gradient for the data input: PyTorch records none either
            assert set(ms_stats) == set(pt_stats), key
            for path, a in ms_stats.items():
                b = pt_stats[path]
                assert a[4] == b[4], (key, path)
                np.testing.assert_allclose(a[:4], b[:4], rtol=2e-5, atol=1e-6, err_msg=f"{key}{path}")
                compared += 1
        assert compared == 23  # 12 forward, 5 backward (none into the data), 6 parameter gradients

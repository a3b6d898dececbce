"""GRAPH_MODE and L2 on MindSpore's CPU build: L2 kernel dumps through MindSpore's own dump (task
tensor), with the layout of seed 000's static-graph section; one clear message for each thing the CPU
build cannot do (statistic kernel dump, TensorDump-based static L0), proved by running it."""

import glob
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

from msprobe.core.errors import ConfigError  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402
from msprobe.mindspore.static_graph import StaticGraphUnsupported  # noqa: E402

# MindSpore's kernel dump file name: {Op}.{scope}.{task}.{stream}.{timestamp}.{input|output}.{i}.{format}.{dtype}.npy
KERNEL_FILE = re.compile(r"^(\w+)\.(\S+)\.(\d+)\.(\d+)\.(\d+)\.(input|output)\.(\d+)\.(\w+)\.(\w+)\.npy$")

L2_SCRIPT = textwrap.dedent("""
    import sys
    from msprobe.mindspore import PrecisionDebugger
    import mindspore as ms
    import numpy as np
    from mindspore import nn
    ms.set_context(mode=ms.GRAPH_MODE)
    debugger = PrecisionDebugger(config_path=sys.argv[1])
    debugger.start()   # before the network is built, as for msProbe

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 3)
            self.relu = nn.ReLU()

        def construct(self, x):
            return self.relu(self.fc(x))

    net = Net()
    x = ms.Tensor(np.arange(8, dtype=np.float32).reshape(2, 4) / 8)
    for _ in range(2):
        out = net(x)
        debugger.stop()
        debugger.step()
    np.save(sys.argv[2], out.asnumpy())
""")


def test_l2_kernel_dump_in_graph_mode(tmp_path):
    cfg = tmp_path / "config.json"
    dump = tmp_path / "dump"
    cfg.write_text(json.dumps({"task": "tensor", "level": "L2", "dump_path": str(dump), "tensor": {}}))
    script = tmp_path / "run.py"
    script.write_text(L2_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(cfg), str(tmp_path / "out.npy")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    settings = json.loads((dump / "kernel_kbyk_dump.json").read_text())
    assert settings["common_dump_settings"]["path"] == str(dump) and settings["e2e_dump_settings"]["enable"]
    iters = sorted(glob.glob(str(dump / "rank_0" / "Net" / "*" / "*")))
    assert [os.path.basename(p) for p in iters] == ["0", "1"]  # one directory per iteration (step)
    files = os.listdir(iters[1])
    parsed = [KERNEL_FILE.match(f) for f in files]
    assert all(parsed), [f for f, m in zip(files, parsed) if not m]
    ops_seen = {m.group(1) for m in parsed}
    assert {"MatMul", "BiasAdd", "ReLU"} <= ops_seen
    relu_out = [f for f in files if f.startswith("ReLU.") and ".output.0." in f]
    assert len(relu_out) == 1 and relu_out[0].endswith(".Float32.npy")
    np.testing.assert_array_equal(np.load(os.path.join(iters[1], relu_out[0])), np.load(tmp_path / "out.npy"))
    bias_out = [f for f in files if f.startswith("BiasAdd.") and ".output.0." in f][0]
    relu_in = [f for f in files if f.startswith("ReLU.") and ".input.0." in f][0]
    np.testing.assert_array_equal(np.load(os.path.join(iters[1], bias_out)), np.load(os.path.join(iters[1], relu_in)))


@pytest.fixture
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        yield
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_cpu_limits_are_named_in_one_line(tmp_path, graph_mode):
    net = ms.nn.Dense(2, 2)
    with pytest.raises(StaticGraphUnsupported) as e:
        PrecisionDebugger(dump_path=str(tmp_path), level="L0").start(net)
    msg = str(e.value)
    assert "\n" not in msg and "TensorDump" in msg and "CPU" in msg and "PYNATIVE_MODE" in msg
    with pytest.raises(StaticGraphUnsupported, match="statistic kernel dump, which only its GPU and Ascend"):
        PrecisionDebugger(dump_path=str(tmp_path), level="L2").start()
    with pytest.raises(ConfigError, match="L0 | L2 in GRAPH_MODE"):
        PrecisionDebugger(dump_path=str(tmp_path), level="L1").start(net)
    assert "MINDSPORE_DUMP_CONFIG" not in os.environ or not os.environ["MINDSPORE_DUMP_CONFIG"].startswith(
        str(tmp_path))


def test_tensor_dump_really_is_missing_on_cpu():
    """The static-L0 message is not an assumption: the op fails on this build."""
    import glob
    import tempfile
    from msprobe.mindspore.static_graph import tensor_dump_missing
    pattern = os.path.join(tempfile.gettempdir(), "msprobe_tensordump_*")
    before = set(glob.glob(pattern))
    reason = tensor_dump_missing()
    if ms.get_context("device_target") == "CPU":
        assert reason is not None and "TensorDump" in reason
    assert set(glob.glob(pattern)) <= before  # the probe's scratch folder goes with it


L2_PYNATIVE_SCRIPT = textwrap.dedent("""
    import sys
    from msprobe.mindspore import PrecisionDebugger
    import mindspore as ms
    import numpy as np
    from mindspore import nn
    debugger = PrecisionDebugger(config_path=sys.argv[1])
    debugger.start()

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 3)

        @ms.jit
        def construct(self, x):
            return ms.ops.relu(self.fc(x))

    block = Block()
    x = ms.Tensor(np.ones((2, 4), np.float32))
    for _ in range(2):
        y = ms.mint.tanh(block(x))  # PyNative: not a kernel of the compiled graph
        debugger.stop()
        debugger.step()
""")


def test_l2_in_pynative_dumps_the_jit_compiled_part(tmp_path):
    cfg = tmp_path / "config.json"
    dump = tmp_path / "dump"
    cfg.write_text(json.dumps({"task": "tensor", "level": "L2", "dump_path": str(dump), "step": [1],
                               "tensor": {"data_mode": ["output"]}}))
    script = tmp_path / "run.py"
    script.write_text(L2_PYNATIVE_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(cfg)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((dump / "kernel_kbyk_dump.json").read_text())["common_dump_settings"]["iteration"] == "1"
    files = [os.path.basename(p) for p in glob.glob(str(dump / "rank_0" / "Net" / "*" / "*" / "*.npy"))]
    kinds = {KERNEL_FILE.match(f).group(1) for f in files}
    assert {"MatMul", "BiasAdd", "ReLU"} <= kinds and "Tanh" not in kinds
    assert all(KERNEL_FILE.match(f).group(6) == "output" for f in files)  # data_mode output
    iterations = {os.path.basename(p) for p in glob.glob(str(dump / "rank_0" / "Net" / "*" / "*"))}
    assert iterations == {"1"}  # config step [1] -> MindSpore iteration "1" only

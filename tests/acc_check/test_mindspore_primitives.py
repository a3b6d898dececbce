"""acc_check of MindSpore Primitives rebuilt from the constructor arguments the dump records
(api_sources.json): the example CNN's Conv2d, BatchNorm, Dense (MatMul + BiasAdd), max pooling and
ReLU, a network of the other common layers, the float64 Conv2D and BatchNorm benchmarks against
MindSpore's own kernels, and a dump without the file (one reason per skipped API, a count at the end)."""

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from acc_fixtures import dump_json_of
from private_modules import load_private

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

from mindspore import nn, ops  # noqa: E402
from mindspore.ops import operations as P  # noqa: E402

from msprobe.core.acc_check.runner import run_acc_check  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402
from msprobe.mindspore.acc_check.primitives import RebuiltPrimitive  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rows(path):
    with open(path, encoding="utf-8-sig", newline="") as f:
        return {r["API Name"]: r for r in csv.DictReader(f)}


class Layers(nn.Cell):
    """The common layers the example CNN does not have: strided, padded and grouped convolution without
    bias, BatchNorm, average pooling, Dense with an activation, Sigmoid, Tanh, Softmax."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, stride=2, pad_mode="pad", padding=(1, 0, 2, 1), group=2, has_bias=False)
        self.dilated = nn.Conv2d(6, 6, 3, dilation=2, pad_mode="same", has_bias=True)
        self.bn = nn.BatchNorm2d(6)
        self.pool = nn.AvgPool2d(2, 2)
        self.flat = nn.Flatten()
        self.fc = nn.Dense(6 * 2 * 2, 8, activation="tanh")
        self.sigmoid, self.softmax = nn.Sigmoid(), nn.Softmax()

    def construct(self, x):
        x = self.pool(self.bn(self.dilated(self.conv(x))))
        return self.softmax(self.sigmoid(self.fc(self.flat(x))))


def dump_one_step(tmp_path, net, x, y):
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, opt.parameters)
    net.set_train()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1", task="statistics")
    dbg.start(net)
    _, grads = grad_fn(x, y)
    opt(grads)
    dbg.stop()
    dbg.step()
    dbg.close()
    return dump_json_of(tmp_path / "dump")


@pytest.fixture(scope="module")
def cnn_dump(tmp_path_factory):
    models = load_private("msprobe_example_ms_models", os.path.join(ROOT, "examples", "mindspore_models.py"))
    work = models.Workload("cnn")
    x, _ = work.batch()
    return dump_one_step(tmp_path_factory.mktemp("cnn"), work.model, x, ms.Tensor(np.zeros((16, 10), np.float32)))


def primitive_results(dump, tmp_path):
    report = run_acc_check(dump, out_path=str(tmp_path), progress=False)
    return {n: r for n, r in rows(report.result_csv).items() if n.startswith("Primitive.")}


def test_cnn_layers_are_checked_against_float64(cnn_dump, tmp_path):
    assert os.path.isfile(os.path.join(os.path.dirname(cnn_dump), "api_sources.json"))
    result = primitive_results(cnn_dump, tmp_path)
    kinds = {n.split(".")[2] for n in result}
    assert {"Conv2D", "BiasAdd", "BatchNorm", "ReLU", "MaxPool", "MatMul"} <= kinds
    for name, r in result.items():
        assert r["Forward Test Success"] == "pass" and r["Forward Dtype Check"] == "pass", (name, r)
        assert r["Backward Test Success"] in ("pass", ""), (name, r)
    # both convolutions (3 -> 8 and 8 -> 16 channels: one dump name, two instances) and their backward
    for conv in ("Primitive.conv2d.Conv2D.0", "Primitive.conv2d.Conv2D.1", "Primitive.bn_train.BatchNorm.1"):
        assert result[conv]["Backward Test Success"] == "pass"


def test_other_common_layers_are_checked(tmp_path):
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((4, 4, 9, 8)).astype(np.float32))
    dump = dump_one_step(tmp_path, Layers(), x, ms.Tensor(np.full((4, 8), 0.125, np.float32)))
    result = primitive_results(dump, tmp_path / "out")
    kinds = {n.split(".")[2] for n in result}
    assert {"Conv2D", "BatchNorm", "AvgPool", "MatMul", "BiasAdd", "Tanh", "Sigmoid", "Softmax"} <= kinds
    for name, r in result.items():
        assert r["Forward Test Success"] == "pass" and r["Forward Dtype Check"] == "pass", (name, r)


@pytest.mark.parametrize("attrs", [
    dict(out_channel=4, kernel_size=3, pad_mode="same"),
    dict(out_channel=4, kernel_size=4, pad_mode="same", stride=2),               # even kernel: uneven padding
    dict(out_channel=4, kernel_size=(3, 2), pad_mode="valid", stride=(2, 1), dilation=2),
    dict(out_channel=6, kernel_size=3, pad_mode="pad", pad=(1, 2, 0, 1), group=3),
    dict(out_channel=4, kernel_size=5, pad_mode="same", stride=3, dilation=(1, 2)),
])
def test_conv2d_benchmark_is_mindspores_convolution_in_float64(attrs):
    rng = np.random.default_rng(0)
    kernel = attrs["kernel_size"] if isinstance(attrs["kernel_size"], tuple) else (attrs["kernel_size"],) * 2
    x = rng.standard_normal((2, 6, 11, 10))
    w = rng.standard_normal((attrs["out_channel"], 6 // attrs.get("group", 1)) + kernel)
    prim = P.Conv2D(**attrs)
    bench = RebuiltPrimitive(prim).bench(ms.Tensor(x), ms.Tensor(w))
    assert bench.dtype == ms.float64
    tested = prim(ms.Tensor(x, ms.float32), ms.Tensor(w, ms.float32)).asnumpy()
    np.testing.assert_allclose(bench.asnumpy(), tested, atol=2e-5)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_benchmark_is_mindspores_in_float64(training):
    rng = np.random.default_rng(1)
    x, scale, bias = rng.standard_normal((4, 3, 5, 5)) * 2 + 1, rng.standard_normal(3), rng.standard_normal(3)
    mean, var = rng.standard_normal(3), rng.random(3) + 0.5
    prim = P.BatchNorm(is_training=training, epsilon=1e-3)
    rebuilt = RebuiltPrimitive(prim)
    assert rebuilt.compared_outputs == (0,)
    bench = rebuilt.bench(*(ms.Tensor(a) for a in (x, scale, bias, mean, var)))
    tested = prim(*(ms.Tensor(a, ms.float32) for a in (x, scale, bias, mean, var)))[0].asnumpy()
    np.testing.assert_allclose(bench.asnumpy(), tested, atol=2e-5)


def test_dump_without_api_sources_says_why_per_api_and_counts(cnn_dump, tmp_path):
    """A dump made before msprobe recorded Primitive arguments (or by msProbe): its Primitives with
    constructor arguments are skipped, each with a one-line reason, and the summary counts them."""
    old = tmp_path / "old"
    old.mkdir()
    for name in ("dump.json", "stack.json", "construct.json"):
        (old / name).write_bytes(open(os.path.join(os.path.dirname(cnn_dump), name), "rb").read())
    proc = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "acc_check", "-api_info", str(old / "dump.json"),
                           "-o", str(tmp_path / "out"), "--no_progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    start = lines.index("  skipped:")
    listed = []
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        listed.append(line.strip())
    conv = next(x for x in listed if x.startswith("Primitive.conv2d.Conv2D.0: "))
    assert "constructor arguments (out_channel, kernel_size" in conv and "no api_sources.json" in conv
    assert any(x.startswith("Primitive.bn_train.BatchNorm.1: ") for x in listed)
    n_apis = int(lines[0].split()[1])
    assert lines[start + 1 + len(listed)] == f"  {len(listed)} of {n_apis} APIs skipped"

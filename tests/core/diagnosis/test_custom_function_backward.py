"""A custom autograd Function whose forward is right and whose backward is wrong, found where it is
wrong: its own backward record (gradients in agree, gradients out differ), eager and torch.compile'd,
at L1 and mix, in statistics and tensor mode; with no module around the Function (L1, or a Function
applied in the model's own forward) and inside a module stack. (Eager at mix a Function's module record
holds it: the module is named.)

The wrong backwards: one that makes an extra op (`* 1.5`), and ones that make exactly golden's ops — a
flipped sign, a different constant, two gradients of the same shape swapped, a scale left out of one.
Each plant builds its own Function classes, of the same names as golden's, so the runs differ in
nothing but the backward's code (no argument carries the plant).
"""

import json

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from msprobe.core.compare.engine import compare_dumps  # noqa: E402
from msprobe.core.diagnosis import diagnose, format_diagnosis  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402

from compare.dumped_training import train_dumped  # noqa: E402

PLANTS = ("extra", "sign", "scale", "swap", "unscaled")
# plant -> (the Function whose backward is wrong, the output gradient that differs most)
WRONG = {"extra": ("SwishFn", "output.0"), "sign": ("SwishFn", "output.0"), "scale": ("SwishFn", "output.0"),
         "swap": ("MulFn", "output.1"), "unscaled": ("MulFn", "output.0")}


def swish_function(plant):
    class SwishFn(torch.autograd.Function):
        """x * sigmoid(x), its derivative written by hand."""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * torch.sigmoid(x)

        @staticmethod
        def backward(ctx, grad):
            x, = ctx.saved_tensors
            s = torch.sigmoid(x)
            if plant == "sign":
                g = grad * s * (1 - x * (1 - s))
            elif plant == "scale":
                g = grad * s * (1.5 + x * (1 - s))
            else:
                g = grad * s * (1 + x * (1 - s))
            return g * 1.5 if plant == "extra" else g
    return SwishFn


def mul_function(plant):
    class MulFn(torch.autograd.Function):
        """0.5 * x * y; two gradients of one shape."""

        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(x, y)
            return 0.5 * x * y

        @staticmethod
        def backward(ctx, grad):
            x, y = ctx.saved_tensors
            gx, gy = 0.5 * grad * y, 0.5 * grad * x
            if plant == "swap":
                gx, gy = gy, gx
            elif plant == "unscaled":
                gx = grad * y
            return gx, gy
    return MulFn


class Gate(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, h, g):
        return self.fn.apply(h, g)


class Block(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.gate = Gate(fn)

    def forward(self, h, x):
        return self.gate(h, self.proj(x))


class Net(nn.Module):
    """Linear -> SwishFn (applied here, no module of its own) -> LayerNorm -> Block > Gate > MulFn -> Linear."""

    def __init__(self, plant):
        super().__init__()
        self.swish = swish_function(plant)
        self.fc1 = nn.Linear(8, 16)
        self.ln = nn.LayerNorm(16)
        self.block = Block(mul_function(plant))
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = self.ln(self.swish.apply(self.fc1(x)))
        return self.fc2(torch.tanh(self.block(h, x)))


def train_step(path, plant, level, task, compiled):
    torch.manual_seed(0)
    model = Net(plant)
    run = torch.compile(model, backend="aot_eager") if compiled else model
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 8, generator=gen) * 3, torch.randint(0, 4, (6,), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    debugger = PrecisionDebugger(dump_path=str(path), task=task, level=level)
    try:
        train_dumped(debugger, run, opt, lambda: F.cross_entropy(run(x), y), [()])
    finally:
        torch._dynamo.reset()
    return str(path)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """dump(level, task, compiled, plant) -> dump path, each made once."""
    root = tmp_path_factory.mktemp("custom_fn")
    made = {}

    def dump(level, task, compiled, plant):
        key = (level, task, compiled, plant)
        if key not in made:
            made[key] = train_step(root / "_".join(map(str, key)), plant, level, task, compiled)
        return made[key]
    return dump


def _diagnose(target, golden):
    d = diagnose(compare_dumps(target, golden, progress=False))
    json.dumps(d.to_json(), allow_nan=False)
    return d


def _check_named(d, plant, level):
    fn, output = WRONG[plant]
    top = d["suspects"][0]
    assert (top["api"], top["kind"], top["direction"]) == (f"Function.{fn}.0.backward", "introduced",
                                                           "backward"), format_diagnosis(d)
    assert d["verdict"].startswith(f"error is introduced in backward at Function.{fn}.0.backward")
    assert top["input_error"] == 0.0 and top["output_error"] > 0.1
    assert max(top["outputs"], key=lambda r: r["error"])["name"].endswith(output)
    assert "Function" not in " ".join(s["api"] for s in d["suspects"][1:] if s["kind"] == "introduced")
    # with module context where it has one: MulFn inside Block > Gate (at mix); SwishFn in the model's forward
    module = ["Module.block.Block.backward.0", "Module.block.gate.Gate.backward.0"] if fn == "MulFn" else []
    assert top["module_path"] == (module if level == "mix" else [])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("plant", PLANTS)
def test_statistics_L1_names_the_wrong_backward(dumps, plant, compiled):
    golden = dumps("L1", "statistics", compiled, None)
    _check_named(_diagnose(dumps("L1", "statistics", compiled, plant), golden), plant, "L1")


@pytest.mark.parametrize("plant", ["extra", "scale", "swap"])
def test_statistics_mix_compiled_names_the_wrong_backward_inside_its_modules(dumps, plant):
    golden = dumps("mix", "statistics", True, None)
    _check_named(_diagnose(dumps("mix", "statistics", True, plant), golden), plant, "mix")


def test_statistics_mix_eager_names_the_module_holding_the_function(dumps):
    """Eager at mix a Function is not an API of its own: its module's backward record holds it (MulFn in
    Gate); one applied outside any module leaves a gradient no record produced, and the diagnosis says so
    where it arrives."""
    golden = dumps("mix", "statistics", False, None)
    top = _diagnose(dumps("mix", "statistics", False, "swap"), golden)["suspects"][0]
    assert (top["api"], top["kind"]) == ("Module.block.gate.Gate.backward.0", "introduced")
    d = _diagnose(dumps("mix", "statistics", False, "sign"), golden)
    top = d["suspects"][0]
    assert (top["api"], top["direction"]) == ("Module.fc1.Linear.backward.0", "backward"), format_diagnosis(d)
    assert "no recorded backward produced" in top["reason"]


@pytest.mark.parametrize("level", ["L1", "mix"])
@pytest.mark.parametrize("plant", ["sign", "unscaled"])
def test_tensor_mode_compiled_names_the_wrong_backward(dumps, plant, level):
    golden = dumps(level, "tensor", True, None)
    _check_named(_diagnose(dumps(level, "tensor", True, plant), golden), plant, level)


def test_compiled_records_are_the_eager_records(dumps):
    """At L1 the Function's records in a compiled run are eager's: the same keys in the same order (its
    inner ops folded), no divergence between the two."""
    eager, compiled = dumps("L1", "statistics", False, None), dumps("L1", "statistics", True, None)

    def keys(path):
        return list(json.loads(open(f"{path}/step0/rank0/dump.json", encoding="utf-8").read())["data"])

    assert keys(compiled) == keys(eager)
    assert {"Function.SwishFn.0.backward", "Function.MulFn.0.backward"} <= set(keys(compiled))
    assert _diagnose(compiled, eager)["verdict"].startswith("no divergence")


def test_compiled_function_is_restored_and_compiles_once(tmp_path):
    """Dumped steps of a compiled model with a custom Function compile one entry; the Function's forward
    and backward are the user's again after stop(), and plain steps after it run the code compiled
    before start() (no recompilation)."""
    model = Net(None)
    fn = model.swish
    original = (fn.__dict__["forward"], fn.__dict__["backward"])
    run = torch.compile(model, backend="aot_eager")
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))

    def step():
        F.cross_entropy(run(x), y).backward()

    torch._dynamo.reset()
    step()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1", step=[0, 1, 3])
    try:
        for _ in range(4):  # dumped, dumped, plain, dumped
            debugger.start(run, rank_id=0)
            step()
            debugger.stop()
            assert (fn.__dict__["forward"], fn.__dict__["backward"]) == original
            debugger.step()
    finally:
        debugger.close()
        torch._dynamo.reset()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs == 1
    data = json.loads((tmp_path / "step3" / "rank0" / "dump.json").read_text())["data"]
    assert "Function.SwishFn.0.backward" in data and "Function.MulFn.0.backward" in data


class TwoOut(torch.autograd.Function):
    """(2 w x, 3 x) with a number argument; no gradient for `w` (returned None)."""

    @staticmethod
    def forward(ctx, x, k, w):
        ctx.save_for_backward(w)
        return x * 2 * w, x * k

    @staticmethod
    def backward(ctx, ga, gb):
        w, = ctx.saved_tensors
        return ga * 2 * w + gb * 3, None, None


class Double(torch.autograd.Function):
    """2 x, written in the setup_context style (forward without ctx)."""

    @staticmethod
    def forward(x):
        return x * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class TwiceNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        p, q = TwoOut.apply(self.a(x), 3, self.w)
        r, _ = TwoOut.apply(self.b(p + q), 3, self.w)
        return Double.apply(r).sum()


def test_compiled_function_called_twice_pairs_each_backward(tmp_path):
    """A Function called twice, one output unused, a gradient it returns as None: each backward record
    pairs with its own forward and completes where eager's does (the key order is eager's). One written
    with setup_context is recorded as well."""
    def keys(compiled):
        torch.manual_seed(0)
        model = TwiceNet()
        run = torch.compile(model, backend="aot_eager") if compiled else model
        path = tmp_path / str(compiled)
        debugger = PrecisionDebugger(dump_path=str(path), task="statistics", level="L1")
        try:
            debugger.start(run, rank_id=0)
            run(torch.ones(3, 4)).backward()
            debugger.stop()
            debugger.step()
        finally:
            debugger.close()
            torch._dynamo.reset()
        data = json.loads((path / "step0" / "rank0" / "dump.json").read_text())["data"]
        assert data["Function.TwoOut.0.backward"]["output"][1:] == [None]  # per input tensor: w has None
        return list(data)
    eager = keys(False)
    assert keys(True) == eager
    assert "Function.Double.0.backward" in eager and not any(k.startswith("Tensor.__mul__.") for k in eager)
    assert eager.index("Function.TwoOut.1.backward") < eager.index("Function.TwoOut.0.backward")

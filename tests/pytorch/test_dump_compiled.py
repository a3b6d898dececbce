"""Dumps of torch.compile'd models: the eager run's records, in its order, made inside the compiled
graphs (no graph break) by msprobe's record op; the compiled code runs untouched when msprobe is off;
compiled-vs-eager compare finds no divergence on a plain model and names a planted compile-only change.

Inductor compiles take tens of seconds on two cores: one module-scoped Inductor run of the transformer
(mix, which holds both the module and the API path) serves several tests, the planted change compiles
a two-layer MLP, and the level matrix runs on `aot_eager` (the same Dynamo graphs and record ops,
without Inductor's code generation).
"""

import logging
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch._dynamo  # noqa: F401  (the counters below; torch.compile loads it anyway)
import torch.fx
from msprobe.core.diagnosis import diagnose
from msprobe.core.compare.engine import compare_dumps
from msprobe.core.dump.reader import DumpReader, find_rank_dirs, iter_tensor_records
from msprobe.pytorch import PrecisionDebugger
import msprobe_test_models as models  # loaded by conftest.py

STATS = ("Max", "Min", "Mean", "Norm")


def graph_breaks():
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def compiled_graphs():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def dump_run(tmp, name, level, steps=2, compile_kwargs=None, model=None, data=None, task="statistics"):
    """Train zoo model `name` under a debugger, compiled with `compile_kwargs` (eager when None); returns
    {step: DumpReader} and the dump path."""
    torch.manual_seed(0)
    model = model if model is not None else models.build(name)
    data = data if data is not None else models.batches(name, steps)
    path = str(tmp / "dump")
    dbg = PrecisionDebugger(dump_path=path, level=level, task=task)
    run = torch.compile(model, **compile_kwargs) if compile_kwargs is not None else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for i in range(steps):
            x, y = data[i % len(data)]
            dbg.start(run)
            loss = type(model).loss_of(run(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            dbg.stop()
            dbg.step()
    finally:
        dbg.close()
    return {r.step: DumpReader(r.path) for r in find_rank_dirs(path)}, path


def without_stats(v):
    if isinstance(v, dict):
        return {k: without_stats(x) for k, x in v.items() if k not in STATS}
    if isinstance(v, list):
        return [without_stats(x) for x in v]
    return v


def ordered(keys, exact_interleave):
    """The keys whose order must match: all but parameters_grad (see docs/dump.md); without
    `exact_interleave`, the module records' and the API records' orders each on their own."""
    keys = [k for k in keys if ".parameters_grad." not in k]
    if exact_interleave:
        return keys
    return [k for k in keys if k.startswith("Module.")], [k for k in keys if not k.startswith("Module.")]


def assert_same_records(eager, compiled, rel=1e-4, exact_interleave=True):
    """The same keys in the same order, the same records apart from statistics, and statistics equal
    within `rel` of each tensor's scale."""
    assert sorted(eager) == sorted(compiled)
    for step in eager:
        e, c = eager[step], compiled[step]
        assert ordered(e.keys(), exact_interleave) == ordered(c.keys(), exact_interleave)
        assert sorted(e.keys()) == sorted(c.keys())
        for key in e.keys():
            assert without_stats(e[key]) == without_stats(c[key]), key
            got = dict(iter_tensor_records(c[key]))
            for where, rec in iter_tensor_records(e[key]):
                scale = max(abs(rec["Max"]), abs(rec["Min"]), 1e-6)
                for f in STATS:
                    assert math.isclose(rec[f], got[where][f], rel_tol=rel, abs_tol=rel * scale), (key, where, f)


@pytest.fixture(scope="module")
def inductor_mix(tmp_path_factory):
    """The transformer at mix: eager, then compiled by Inductor with fullgraph=True (a graph break would
    fail the compile; fullgraph=False runs in the tests of the model's own breaks and the planted change)."""
    eager, eager_path = dump_run(tmp_path_factory.mktemp("eager"), "transformer", "mix")
    torch._dynamo.reset()
    breaks, graphs = graph_breaks(), compiled_graphs()
    compiled, compiled_path = dump_run(tmp_path_factory.mktemp("compiled"), "transformer", "mix",
                                       compile_kwargs={"fullgraph": True})
    return {"eager": eager, "compiled": compiled, "eager_path": eager_path, "compiled_path": compiled_path,
            "breaks": graph_breaks() - breaks, "graphs": compiled_graphs() - graphs}


def test_inductor_records_are_the_eager_records(inductor_mix):
    assert_same_records(inductor_mix["eager"], inductor_mix["compiled"])
    for step in (0, 1):
        assert inductor_mix["eager"][step].construct == inductor_mix["compiled"][step].construct
        keys = inductor_mix["compiled"][step].keys()
        assert "Module.attn.Attention.backward.0" in keys and "Functional.softmax.0.backward" in keys


def test_records_are_made_inside_one_graph(inductor_mix):
    """No graph break, one forward graph: the records come from the op the graph keeps."""
    assert inductor_mix["breaks"] == 0
    assert inductor_mix["graphs"] == 1


def test_compiled_vs_eager_compare_finds_no_divergence(inductor_mix):
    results = compare_dumps(inductor_mix["compiled_path"], inductor_mix["eager_path"], progress=False)
    d = diagnose(results)
    assert not d["divergence"] and d["verdict"].startswith("no divergence"), d["verdict"]
    assert all((r.table["Result"] != "error").all() for r in results)


@pytest.mark.parametrize("name,level", [("transformer", "L0"), ("inplace", "L1"), ("cnn", "L1")])
def test_levels_fullgraph(tmp_path, name, level):
    """fullgraph=True, in-place calls (ReLU(inplace=True), `z += h`, `z.mul_(2)`), BatchNorm's running
    statistics updated in place: the eager records, statistics included."""
    eager, _ = dump_run(tmp_path / "e", name, level)
    torch._dynamo.reset()
    breaks = graph_breaks()
    compiled, _ = dump_run(tmp_path / "c", name, level, compile_kwargs={"backend": "aot_eager", "fullgraph": True})
    assert graph_breaks() == breaks
    assert_same_records(eager, compiled, rel=1e-6)


def test_dynamic_shapes(tmp_path):
    """Sequence lengths that change between steps (symbolic shapes, dynamic=True): every int and float
    argument reaches the record op at run time, so the records are the eager ones."""
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(2, t, 16, generator=gen), torch.randint(0, 5, (2, t), generator=gen)) for t in (6, 9)]
    eager, _ = dump_run(tmp_path / "e", "transformer", "L1", data=data)
    torch._dynamo.reset()
    breaks = graph_breaks()
    compiled, _ = dump_run(tmp_path / "c", "transformer", "L1", data=data,
                           compile_kwargs={"backend": "aot_eager", "dynamic": True})
    assert graph_breaks() == breaks
    assert_same_records(eager, compiled, rel=1e-6)
    assert compiled[1]["Tensor.reshape.0.forward"]["input_args"][2] == {"type": "int", "value": 9}


class BreakingNet(nn.Module):
    """A forward Dynamo cannot compile whole: the middle runs eagerly between two graphs."""

    def __init__(self):
        super().__init__()
        self.l, self.head = nn.Linear(8, 8), nn.Linear(8, 4)

    @staticmethod
    @torch._dynamo.disable
    def eager_middle(h):
        return torch.tanh(h) * 2

    def forward(self, x):
        return self.head(self.eager_middle(F.relu(self.l(x))))

    @staticmethod
    def loss_of(out, y):
        return F.cross_entropy(out, y)


def test_graph_breaks_of_the_model_are_its_own(tmp_path):
    """fullgraph=False around the user's own graph break: the calls run eagerly between graphs are
    recorded by the eager path, the compiler's own calls there are not, and msprobe adds no break."""
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(6, 8, generator=gen), torch.randint(0, 4, (6,), generator=gen)) for _ in range(2)]
    torch.manual_seed(0)
    eager, _ = dump_run(tmp_path / "e", None, "mix", model=BreakingNet(), data=data)
    torch._dynamo.reset()
    torch.manual_seed(0)
    plain = BreakingNet()
    breaks = graph_breaks()
    torch.compile(plain, backend="aot_eager")(data[0][0])
    own = graph_breaks() - breaks
    torch._dynamo.reset()
    breaks = graph_breaks()
    torch.manual_seed(0)
    compiled, _ = dump_run(tmp_path / "c", None, "mix", model=BreakingNet(), data=data,
                           compile_kwargs={"backend": "aot_eager"})
    assert graph_breaks() - breaks == own > 0
    # a Linear module's backward and its F.linear's complete on the same gradient (2-D input): docs/dump.md
    assert_same_records(eager, compiled, rel=1e-6, exact_interleave=False)
    assert "Torch.tanh.0.forward" in compiled[0].keys()


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_a_model_compiled_in_place_after_eager_steps(tmp_path, monkeypatch, level):
    """Module hooks made while Dynamo was not loaded have no compile check in front of them (msprobe._call's
    C hooks alone); once the model is compiled in place (`model.compile()`, the same object) the next start()
    makes them again with it: the compiled step breaks no graph and records what an eager step records."""
    import msprobe.pytorch.debugger as debugger_module

    torch.manual_seed(0)
    model = models.build("cnn").eval()  # (batch norm's running statistics stay: the two steps compute alike)
    x, y = models.batches("cnn", 1)[0]
    path = str(tmp_path / "dump")
    dbg = PrecisionDebugger(dump_path=path, level=level, task="statistics")

    def step():
        dbg.start(model)
        type(model).loss_of(model(x), y).backward()
        model.zero_grad()
        dbg.stop()
        dbg.step()

    try:
        with monkeypatch.context() as m:
            m.setattr(debugger_module, "_compiled_capture", lambda: None)  # as if Dynamo were not loaded
            step()
        torch._dynamo.reset()
        model.compile(backend="aot_eager")
        breaks, graphs = graph_breaks(), compiled_graphs()
        step()
        assert graph_breaks() == breaks
        assert compiled_graphs() > graphs  # (it did compile)
    finally:
        dbg.close()
    readers = {r.step: DumpReader(r.path) for r in find_rank_dirs(path)}
    assert_same_records({0: readers[0]}, {0: readers[1]}, rel=1e-6, exact_interleave=False)


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_no_recompile_when_msprobe_is_off(tmp_path, level):
    """Five dumped steps compile one entry; five steps after stop() run the entry compiled before
    start(); dumped and plain steps alternating compile nothing more."""
    model = models.build("transformer")
    x, y = models.batches("transformer", 1)[0]
    run = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(dbg=None):
        if dbg is not None:
            dbg.start(run)
        loss = type(model).loss_of(run(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if dbg is not None:
            dbg.stop()
            dbg.step()

    torch._dynamo.reset()
    step()
    start = compiled_graphs()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level=level, task="statistics",
                            step=[0, 1, 2, 3, 4, 10, 12])
    try:
        for _ in range(5):
            step(dbg)
        assert compiled_graphs() - start == 1  # the dumped steps' entry
        for _ in range(5):  # steps 5-9: not dumped
            step(dbg)
        for _ in range(3):  # 10 dumped, 11 not, 12 dumped
            step(dbg)
        assert compiled_graphs() - start == 1
    finally:
        dbg.close()
    assert sorted(r.step for r in find_rank_dirs(str(tmp_path / "dump"))) == [0, 1, 2, 3, 4, 10, 12]


def test_levels_take_turns_on_one_compiled_model(tmp_path):
    """An L1 debugger, then a mix one, on one compiled model: mix gets compiled code of its own (with its
    module hooks), not the L1 code Dynamo would otherwise find for the same mode."""
    model = models.build("dropout")
    data = models.batches("dropout", 1)
    run = torch.compile(model, backend="aot_eager")
    for level in ("L1", "mix"):
        dbg = PrecisionDebugger(dump_path=str(tmp_path / level), level=level, task="statistics")
        dbg.start(run)
        type(model).loss_of(run(data[0][0]), data[0][1]).backward()
        dbg.stop()
        dbg.close()
    keys = DumpReader(find_rank_dirs(str(tmp_path / "mix"))[0].path).keys()
    assert "Module.l.Linear.forward.0" in keys and "Functional.linear.0.forward" in keys


def test_l2_marks_what_the_compiled_graph_fuses_away(tmp_path, caplog):
    """L2 on a compiled model: the eager run's aten keys; tensors inside an API fused away (no statistics),
    its inputs and outputs with statistics; compare shows the former as "fused away", no divergence."""
    data = models.batches("transformer", 1)

    def forward_only(path, compiled):
        torch.manual_seed(0)
        model = models.build("transformer")
        run = torch.compile(model, backend="aot_eager") if compiled else model
        dbg = PrecisionDebugger(dump_path=str(path), level="L2", task="statistics")
        dbg.start(run)
        run(data[0][0])
        dbg.stop()
        dbg.close()
        return DumpReader(find_rank_dirs(str(path))[0].path)

    eager = forward_only(tmp_path / "e", False)
    with caplog.at_level(logging.WARNING):
        compiled = forward_only(tmp_path / "c", True)
    assert sum("level L2 on a compiled model" in r.getMessage() for r in caplog.records) == 1
    assert list(eager.keys()) == list(compiled.keys())
    addmm = compiled["Aten.addmm.default.0.forward"]
    assert addmm["input_args"][0]["Max"] is not None  # the bias: an input of F.linear
    assert addmm["input_args"][2]["fused_away"] and addmm["input_args"][2]["Max"] is None  # weight.t()
    results = compare_dumps(str(tmp_path / "c"), str(tmp_path / "e"), progress=False)
    table = results[0].table
    fused = table[table["Result"] == "fused away"]
    assert len(fused) and "Aten.t.default.0.forward.output.0" in set(fused["NPU Name"])
    assert set(table["Result"]) <= {"pass", "fused away"}
    assert not diagnose(results)["divergence"]


class GeluMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))

    @staticmethod
    def loss_of(out, y):
        return F.cross_entropy(out, y)


def test_compare_names_a_compile_only_numerics_change(tmp_path, monkeypatch):
    """Inductor given another decomposition of gelu (the sigmoid approximation x * sigmoid(1.702 x)) than
    eager computes: the compiled-vs-eager diagnosis names Functional.gelu.0.forward."""
    import torch._inductor.config as inductor_config
    from torch._inductor import decomposition

    def sigmoid_gelu(x, approximate="none"):
        return x * torch.sigmoid(1.702 * x)

    for table in (decomposition.decompositions, decomposition.fast_random_decomps()):  # (the latter: cached)
        monkeypatch.setitem(table, torch.ops.aten.gelu.default, sigmoid_gelu)
    monkeypatch.setattr(inductor_config, "force_disable_caches", True)  # no cached kernel of the real gelu
    gen = torch.Generator().manual_seed(3)
    data = [(3 * torch.randn(32, 16, generator=gen), torch.randint(0, 4, (32,), generator=gen))]
    torch.manual_seed(0)
    _, eager = dump_run(tmp_path / "e", None, "L1", steps=1, model=GeluMLP(), data=data)
    torch._dynamo.reset()
    torch.manual_seed(0)
    _, compiled = dump_run(tmp_path / "c", None, "L1", steps=1, model=GeluMLP(), data=data, compile_kwargs={})
    d = diagnose(compare_dumps(compiled, eager, progress=False))
    assert d["divergence"], d["verdict"]
    assert d["suspects"][0]["api"] == "Functional.gelu.0.forward"


def test_backend_note_at_start(tmp_path, caplog):
    """A backend msprobe does not know: one line at start() saying what may not work, and the dump goes on."""
    def my_backend(gm, example_inputs):
        return gm.forward

    model = models.build("dropout")
    x, _ = models.batches("dropout", 1)[0]
    run = torch.compile(model, backend=my_backend)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1", task="statistics")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            dbg.start(run)
            run(x)
            dbg.stop()
            dbg.step()
    dbg.close()
    notes = [r.getMessage() for r in caplog.records if "my_backend" in r.getMessage()]
    assert len(notes) == 1 and "msprobe::record" in notes[0]
    assert "Functional.linear.0.forward" in DumpReader(find_rank_dirs(str(tmp_path / "dump"))[0].path).keys()


def test_user_fx_graph_module_is_the_users_code(tmp_path):
    """A model the user traced with torch.fx, run eagerly while Dynamo is loaded: its calls come from
    generated code, like a compiled graph's, and are recorded all the same."""
    gm = torch.fx.symbolic_trace(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "dump"), level="L1", task="statistics")
    dbg.start(gm)
    gm(torch.randn(2, 4))
    dbg.stop()
    dbg.close()
    keys = DumpReader(find_rank_dirs(str(tmp_path / "dump"))[0].path).keys()
    assert list(keys) == ["Functional.linear.0.forward", "Functional.relu.0.forward"]

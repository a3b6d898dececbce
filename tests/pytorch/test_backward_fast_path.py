"""BackwardTracker's shortcut for calls made of one autograd node must record exactly what the
general graph walk records: every zoo model dumped both ways gives the same dump.json."""

import os

import pytest
import torch

from msprobe.pytorch.capture.backward import BackwardTracker
import msprobe_test_models as models  # loaded by conftest.py


def _dump_data(tmp, name, level):
    run = models.run_dump(tmp, name, level, "statistics")
    return {step: reader.data for step, reader in run.readers.items()}


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("name", list(models.ZOO))
def test_one_node_shortcut_equals_the_graph_walk(tmp_path, monkeypatch, made, name, level):
    """(The shortcut is taken in C, msprobe._call's edges.c, where nothing is saved, else in Python; the
    walk in C where it is built: both against the Python walk alone.)"""
    from msprobe.pytorch.capture import backward

    taken = []
    shortcut = BackwardTracker._attach_one_node.__func__

    def counting(cls, *args):
        got = shortcut(cls, *args)
        taken.append(got is not False)
        return got

    monkeypatch.setattr(BackwardTracker, "_attach_one_node", classmethod(counting))
    fast = _dump_data(tmp_path / "fast", name, level)
    # (at L0 the RNN's and the dict-output net's modules return several tensors: always the walk)
    assert any(taken) or made.native or (level == "L0" and name in ("rnn", "dictout")), "the shortcut never applied"
    # (and the other calls walked in C: at mix F.linear's weight is reached through its transpose, which
    # mix does not fold; a call none of whose inputs needs a gradient, a root module's, walks nothing)
    assert made.c_walks or not made.walks_wanted or level == "L1" or backward._walk is None
    assert len(made.c_walks) == len(made.walks_wanted) or backward._walk is None
    _walk_only(monkeypatch)
    monkeypatch.setattr(BackwardTracker, "_attach_one_node", classmethod(lambda cls, *args: False))
    made.clear()
    walk = _dump_data(tmp_path / "walk", name, level)
    assert not made.native and not made.c_walks
    assert fast == walk


@pytest.mark.parametrize("name", ["cnn", "rnn", "dropout", "dictout"])
def test_a_weight_read_through_its_transpose_equals_hooking_the_transpose(tmp_path, monkeypatch, made, name):
    """At L1 F.linear's weight gradient is read at the call's one hook (the transpose of what enters
    `weight.t()`'s node), not by a second hook on that node: the same dump.json, .npy files included."""
    from msprobe.pytorch.capture import backward

    fast = models.run_dump(tmp_path / "fast", name, "L1", "tensor")
    assert any(backward._TRANSPOSED in steps for steps in made.chains()), "no weight was read through its transpose"
    _walk_only(monkeypatch, reshapes=False)
    walk = models.run_dump(tmp_path / "walk", name, "L1", "tensor")
    _assert_same_dumps(fast, walk)


@pytest.mark.parametrize("name", ["transformer", "rnn"])
def test_a_linear_on_a_3d_input_is_read_at_its_product_as_the_walk_reads_it(tmp_path, monkeypatch, made, name):
    """At L1 F.linear on a 3-d input (its input flattened by a view, its 2-d product viewed back) is
    hooked at the product's node, with a pre-hook on the output's view, instead of by a walk that
    hooks every node it made: the same dump.json (in the same order), .npy files included."""
    from msprobe.pytorch.capture import backward

    fast = models.run_dump(tmp_path / "fast", name, "L1", "tensor")
    assert any(made.splits()), "no call's output was read through its reshape"
    _walk_only(monkeypatch, chains=False)
    made.clear()
    walk = models.run_dump(tmp_path / "walk", name, "L1", "tensor")
    assert not any(made.splits())
    _assert_same_dumps(fast, walk)


class _Autocast(torch.nn.Module):
    """The zoo's transformer run under CPU bf16 autocast after a float32 Linear: every F.linear casts
    its weight and its bias inside the call, the first one its float32 input too."""

    loss_of = staticmethod(models.TransformerBlock.loss_of)

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.pre = torch.nn.Linear(models.TransformerBlock.DIM, models.TransformerBlock.DIM)
        self.inner = models.build("transformer")

    def forward(self, x):
        h = self.pre(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.inner(h).float()


@pytest.mark.parametrize("task", ["tensor", "md5"])
def test_autocasts_casts_are_read_through_at_the_calls_node_as_the_walk_reads_them(tmp_path, monkeypatch, made, task):
    """Under autocast F.linear's backward reaches its weight through a transpose and a cast, its bias
    through a cast and a float32 input through a flattening view and a cast, all made in the call: at
    L1 one hook reads each gradient as those nodes hand it on (cast back to the input's dtype), and
    the dump equals the walk's, which hooks every one of those nodes."""
    from msprobe.pytorch.capture import backward

    data = models.batches("transformer", 2)
    fast = models.run_dump(tmp_path / "fast", "transformer", "L1", task, model=_Autocast(), data=data)
    cast = [steps for steps in made.chains() if any(step[0] == backward._CAST for step in steps)]
    assert {backward._TRANSPOSED, (backward._CAST, torch.float32)} <= {step for steps in cast for step in steps}
    assert any(steps[0][0] == backward._RESHAPE for steps in cast), "no float32 input read through its cast"
    assert any(made.splits())
    assert bool(made.native) == (task == "md5")  # (the C hooks: where nothing is saved)
    _walk_only(monkeypatch)
    walk = models.run_dump(tmp_path / "walk", "transformer", "L1", task, model=_Autocast(), data=data)
    if task == "tensor":
        _assert_same_dumps(fast, walk)
    else:
        for step, reader in fast.readers.items():
            assert list(reader.data.items()) == list(walk.readers[step].data.items())
        assert any("md5" in rec for v in fast.readers[0].data.values() for rec in models.tensor_records(v))


class _Made:
    """The one-node hooks made as dumps run: OneNodeHooks (Python) and msprobe._call's NodeHooks (C,
    where nothing is saved: most of them chosen in C too, by edges.c)."""

    def __init__(self):
        self.python_splits, self.python_chains, self.native = [], [], []
        self.c_walks = []  # the walks made in C (edges.c): their edges
        self.walks_wanted = []  # calls _attach_walk took with an input that needs a gradient

    def splits(self):
        """Whether each reads its output's gradient at a reshape's pre-hook."""
        return self.python_splits + [bool(hook.split) for hook in self.native]

    def chains(self):
        """The steps of every chain of nodes read through."""
        return self.python_chains + [how for hook in self.native for _, _, how in hook.slots if how is not False]

    def clear(self):
        for made in (self.python_splits, self.python_chains, self.native, self.c_walks, self.walks_wanted):
            made.clear()


@pytest.fixture
def made(monkeypatch):
    """A _Made that fills as dumps run."""
    from msprobe.pytorch.capture import backward

    got = _Made()
    real_init, real_chain = backward.OneNodeHook.__init__, backward._input_chain

    def counting(self, *args):
        real_init(self, *args)
        got.python_splits.append(self.split)

    def counting_chain(*args):
        chain = real_chain(*args)
        if chain is not None:
            got.python_chains.append(chain[1])
        return chain

    monkeypatch.setattr(backward.OneNodeHook, "__init__", counting)
    monkeypatch.setattr(backward, "_input_chain", counting_chain)
    real_attach_walk = backward.BackwardTracker._attach_walk.__func__

    def counting_attach_walk(cls, session, key, inputs, *args, **kwargs):
        if any(edge is not None for edge in inputs):
            got.walks_wanted.append(key)
        return real_attach_walk(cls, session, key, inputs, *args, **kwargs)

    monkeypatch.setattr(backward.BackwardTracker, "_attach_walk", classmethod(counting_attach_walk))
    if backward._walk is not None:
        real_walk = backward._walk

        def counting_walk(*args):
            edges, cast_to = real_walk(*args)
            got.c_walks.append(edges)
            return edges, cast_to

        monkeypatch.setattr(backward, "_walk", counting_walk)
    try:
        from msprobe import _call
    except ImportError:
        _call = None
    if _call is not None:
        _call.made_hooks(got.native)
    yield got
    if _call is not None:
        _call.made_hooks(None)


def _walk_only(monkeypatch, reshapes=True, chains=True):
    """From here on no shortcut through a reshape's pre-hook (`reshapes`) or a chain of nodes (`chains`):
    those nodes are hooked as the walk hooks them. The C graph reads are off: backward.py decides all."""
    from msprobe.pytorch.capture import backward

    monkeypatch.setattr(backward, "NODE_TYPES", None)
    if reshapes:
        monkeypatch.setattr(backward, "_RESHAPES", ())
    if chains:
        monkeypatch.setattr(backward, "_input_chain", lambda *args: None)


def _assert_same_dumps(fast, walk):
    """Two runs' dump.json equal, record for record and in order, and their tensor files byte for byte."""
    assert fast.readers.keys() == walk.readers.keys()
    for step, reader in fast.readers.items():
        assert reader.data == walk.readers[step].data
        assert list(reader.data) == list(walk.readers[step].data)
        fast_dir = os.path.join(reader.rank_dir, "dump_tensor_data")
        walk_dir = os.path.join(walk.readers[step].rank_dir, "dump_tensor_data")
        names = sorted(os.listdir(fast_dir))
        assert any(".backward." in n for n in names)
        assert names == sorted(os.listdir(walk_dir))
        for n in names:
            with open(os.path.join(fast_dir, n), "rb") as a, open(os.path.join(walk_dir, n), "rb") as b:
                assert a.read() == b.read(), n


def _linear_tanh_step(tmp_path, level, shape=(4, 8)):
    """A debugger at `level`, a Linear+Tanh model and one step's forward (not its backward) on an input of
    `shape` (3-d: at L1 the Linear's product is viewed back, its output gradient read by a pre-hook)."""
    import torch
    from msprobe.pytorch import PrecisionDebugger

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics", level=level)
    debugger.start(model)
    loss = model(torch.randn(*shape)).square().mean()
    return debugger, model, loss


def _backward_keys(tmp_path):
    from msprobe.core.dump.reader import DumpReader, find_rank_dirs

    keys = {}
    for r in find_rank_dirs(str(tmp_path / "dump")):
        with open(os.path.join(r.path, "dump.json"), encoding="utf-8") as f:
            text = f.read()
        data = DumpReader(r.path).data
        keys[r.step] = sorted(k for k in data if ".backward" in k)
        for k in keys[r.step]:  # written once, not once per backward pass
            assert text.count(f'"{k}"') == 1, k
    return keys


@pytest.mark.parametrize("shape", [(4, 8), (2, 4, 8)])
@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_graph_run_backward_twice_records_each_call_once(tmp_path, level, shape):
    debugger, _, loss = _linear_tanh_step(tmp_path, level, shape)
    loss.backward(retain_graph=True)
    loss.backward()
    debugger.stop()
    debugger.step()
    debugger.close()
    keys = _backward_keys(tmp_path)[0]
    assert keys, "no backward record"


@pytest.mark.parametrize("shape", [(4, 8), (2, 4, 8)])
@pytest.mark.parametrize("level", ["L0", "L1"])
def test_a_graph_kept_past_its_step_records_nothing_and_pins_no_session(tmp_path, level, shape):
    """A loss kept past step() (a log of losses) holds the hooks of its graph: its backward, run later,
    adds no record to any step, and the ended step's session is not kept alive by it."""
    import gc
    import weakref

    import torch
    from msprobe.pytorch import _state

    debugger, model, kept = _linear_tanh_step(tmp_path, level, shape)
    kept_too = model(torch.randn(*shape)).sum()
    session = weakref.ref(_state.session)
    debugger.stop()
    debugger.step()
    kept.backward()  # at once: the ended step's session may not be collected yet
    gc.collect()
    assert session() is None, "the ended step's session is kept alive by a graph's hooks"
    debugger.start(model)
    model(torch.randn(*shape)).sum().backward()
    kept_too.backward()  # the first step's graph: its hooks fire in the second step
    debugger.stop()
    debugger.step()
    debugger.close()
    keys = _backward_keys(tmp_path)
    assert keys.get(0, []) == [], keys
    assert keys[1], "the second step's own backward was not recorded"


def test_a_walk_with_no_input_to_reach_finds_no_edge():
    """_attach_walk skips the walk of a call none of whose inputs needs a gradient (a model fed token
    ids): both walks find no edge and no cast there, however large the graph."""
    from msprobe.pytorch.capture import backward

    emb = torch.nn.Embedding(10, 4)
    out = torch.nn.Linear(4, 4)(emb(torch.tensor([[1, 2, 3]]))).relu().sum()
    node = out.grad_fn
    assert backward._walk_nodes({id(node): (node, [(0, 0)])}, {}, {}, -1) == ({}, {})
    if backward._walk is not None:
        assert backward._walk([node], {}, {}, -1, backward.MAX_NODES, backward.NODE_TYPES) == ({}, {})

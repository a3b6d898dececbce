"""BackwardTracker's shortcut for calls made of one autograd node must record exactly what the
general graph walk records: every zoo model dumped both ways gives the same dump.json."""

import os

import pytest

from msprobe.pytorch.capture.backward import BackwardTracker
import msprobe_test_models as models  # loaded by conftest.py


def _dump_data(tmp, name, level):
    run = models.run_dump(tmp, name, level, "statistics")
    return {step: reader.data for step, reader in run.readers.items()}


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("name", list(models.ZOO))
def test_one_node_shortcut_equals_the_graph_walk(tmp_path, monkeypatch, name, level):
    taken = []
    shortcut = BackwardTracker._attach_one_node.__func__

    def counting(cls, *args):
        got = shortcut(cls, *args)
        taken.append(got is not False)
        return got

    monkeypatch.setattr(BackwardTracker, "_attach_one_node", classmethod(counting))
    fast = _dump_data(tmp_path / "fast", name, level)
    # (at L0 the RNN's and the dict-output net's modules return several tensors: always the walk)
    assert any(taken) or (level == "L0" and name in ("rnn", "dictout")), "the shortcut never applied"
    monkeypatch.setattr(BackwardTracker, "_attach_one_node", classmethod(lambda cls, *args: False))
    walk = _dump_data(tmp_path / "walk", name, level)
    assert fast == walk


@pytest.mark.parametrize("name", ["cnn", "rnn", "dropout", "dictout"])
def test_a_weight_read_through_its_transpose_equals_hooking_the_transpose(tmp_path, monkeypatch, name):
    """At L1 F.linear's weight gradient is read at the call's one hook (the transpose of what enters
    `weight.t()`'s node), not by a second hook on that node: the same dump.json, .npy files included."""
    from msprobe.pytorch.capture import backward

    folded = []
    real = backward._transposed_leaf

    def counting(node, wanted):
        got = real(node, wanted)
        folded.append(got is not None)
        return got

    monkeypatch.setattr(backward, "_transposed_leaf", counting)
    fast = models.run_dump(tmp_path / "fast", name, "L1", "tensor")
    assert any(folded), "no weight was read through its transpose"
    monkeypatch.setattr(backward, "_transposed_leaf", lambda node, wanted: None)
    walk = models.run_dump(tmp_path / "walk", name, "L1", "tensor")
    _assert_same_dumps(fast, walk)


@pytest.mark.parametrize("name", ["transformer", "rnn"])
def test_a_linear_on_a_3d_input_is_read_at_its_product_as_the_walk_reads_it(tmp_path, monkeypatch, name):
    """At L1 F.linear on a 3-d input (its input flattened by a view, its 2-d product viewed back) is
    hooked at the product's node, with a pre-hook on the output's view, instead of by a walk that
    hooks every node it made: the same dump.json (in the same order), .npy files included."""
    from msprobe.pytorch.capture import backward

    split = []
    real_init = backward.OneNodeHook.__init__

    def counting(self, *args):
        real_init(self, *args)
        split.append(self.split)

    monkeypatch.setattr(backward.OneNodeHook, "__init__", counting)
    fast = models.run_dump(tmp_path / "fast", name, "L1", "tensor")
    assert any(split), "no call's output was read through its reshape"
    monkeypatch.setattr(backward, "_RESHAPES", ())
    split.clear()
    walk = models.run_dump(tmp_path / "walk", name, "L1", "tensor")
    assert not any(split)
    _assert_same_dumps(fast, walk)


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


def _linear_tanh_step(tmp_path, level):
    """A debugger at `level`, a Linear+Tanh model and one step's forward (not its backward)."""
    import torch
    from msprobe.pytorch import PrecisionDebugger

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="statistics", level=level)
    debugger.start(model)
    loss = model(torch.randn(4, 8)).square().mean()
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


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_graph_run_backward_twice_records_each_call_once(tmp_path, level):
    debugger, _, loss = _linear_tanh_step(tmp_path, level)
    loss.backward(retain_graph=True)
    loss.backward()
    debugger.stop()
    debugger.step()
    debugger.close()
    keys = _backward_keys(tmp_path)[0]
    assert keys, "no backward record"


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_a_graph_kept_past_its_step_records_nothing_and_pins_no_session(tmp_path, level):
    """A loss kept past step() (a log of losses) holds the hooks of its graph: its backward, run later,
    adds no record to any step, and the ended step's session is not kept alive by it."""
    import gc
    import weakref

    import torch
    from msprobe.pytorch import _state

    debugger, model, kept = _linear_tanh_step(tmp_path, level)
    kept_too = model(torch.randn(4, 8)).sum()
    session = weakref.ref(_state.session)
    debugger.stop()
    debugger.step()
    kept.backward()  # at once: the ended step's session may not be collected yet
    gc.collect()
    assert session() is None, "the ended step's session is kept alive by a graph's hooks"
    debugger.start(model)
    model(torch.randn(4, 8)).sum().backward()
    kept_too.backward()  # the first step's graph: its hooks fire in the second step
    debugger.stop()
    debugger.step()
    debugger.close()
    keys = _backward_keys(tmp_path)
    assert keys.get(0, []) == [], keys
    assert keys[1], "the second step's own backward was not recorded"

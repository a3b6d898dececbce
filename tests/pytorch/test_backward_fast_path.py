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
    assert fast.readers.keys() == walk.readers.keys()
    for step, reader in fast.readers.items():
        assert reader.data == walk.readers[step].data
        fast_dir = os.path.join(reader.rank_dir, "dump_tensor_data")
        walk_dir = os.path.join(walk.readers[step].rank_dir, "dump_tensor_data")
        names = sorted(os.listdir(fast_dir))
        assert any(".backward." in n for n in names)
        assert names == sorted(os.listdir(walk_dir))
        for n in names:
            with open(os.path.join(fast_dir, n), "rb") as a, open(os.path.join(walk_dir, n), "rb") as b:
                assert a.read() == b.read(), n

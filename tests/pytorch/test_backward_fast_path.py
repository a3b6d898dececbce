"""BackwardTracker's shortcut for calls made of one autograd node must record exactly what the
general graph walk records: every zoo model dumped both ways gives the same dump.json."""

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

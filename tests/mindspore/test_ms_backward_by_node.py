"""While ops run synchronously a call's share of its inputs' gradients is read on the autograd nodes
the call made (capture/grad_nodes.py), not through a stand-in per input. The records, their values and
their order in dump.json and construct.json are the same either way, at every level, on a model where
a tensor feeds several calls, a call takes one tensor twice, an output is unused, a data input reaches
a LayerNorm (which computes its gradient even when nobody asks for it), a Cell runs twice, an input is
handed back, and calls change tensors in place."""

import glob
import json
import os
import re

import pytest

pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

from msprobe.mindspore.capture import backward, grad_nodes  # noqa: E402


def _train(models, name, debugger):
    if name == "shared_use":
        models.train_shared_use(debugger)
    else:
        net = models.build(name)
        x, y = models.make_data(name)
        models.train(net, x, y, steps=3, debugger=debugger)


def _dump(models, root, name, level, summary_mode="statistics"):
    from msprobe.mindspore import PrecisionDebugger
    root.mkdir()
    config = root / "config.json"
    config.write_text(json.dumps({"task": "statistics", "level": level, "dump_path": str(root / "dump"),
                                  "statistics": {"summary_mode": summary_mode}}))
    debugger = PrecisionDebugger(config_path=str(config))
    _train(models, name, debugger)
    debugger.close()
    files = {}
    for path in sorted(glob.glob(str(root / "dump" / "step*" / "*" / "*.json"))):
        if path.endswith("stack.json"):  # the test's own lines differ between the two runs
            continue
        rel = re.sub(r"proc\d+", "proc", os.path.relpath(path, root))
        files[rel] = re.sub(r"proc\d+", "proc", open(path).read().replace(str(root), "ROOT"))
    return files


class _Count:
    def __init__(self, monkeypatch):
        self.hooked = self.standins = 0
        edges, standin = backward.input_edges, backward.GradTracker._standin

        def counted_edges(*args):
            found = edges(*args)
            self.hooked += len(found[0])
            return found

        def counted_standin(tracker, v, make_hook):
            self.standins += 1
            return standin(tracker, v, make_hook)
        monkeypatch.setattr(backward, "input_edges", counted_edges)
        monkeypatch.setattr(backward.GradTracker, "_standin", counted_standin)


@pytest.mark.parametrize("name,level,summary_mode", [
    ("shared_use", "L0", "statistics"), ("shared_use", "L1", "statistics"), ("shared_use", "L1", "md5"),
    ("shared_use", "mix", "statistics"), ("mlp", "L0", "statistics"), ("transformer", "mix", "statistics")])
def test_records_by_node_are_those_of_stand_ins(models, tmp_path, monkeypatch, name, level, summary_mode):
    by_node = _Count(monkeypatch)
    got = _dump(models, tmp_path / "by_node", name, level, summary_mode)
    hooked, standins = by_node.hooked, by_node.standins
    assert hooked > 0  # the node way was taken
    with monkeypatch.context() as m:
        m.setattr(grad_nodes.NodeGraph, "needed", lambda self, v, node: False)  # a stand-in for every input
        stand_ins = _Count(m)
        want = _dump(models, tmp_path / "stand_ins", name, level, summary_mode)
    assert stand_ins.hooked == 0 and stand_ins.standins > standins
    assert sorted(got) == sorted(want) and len(want) >= 6  # dump.json, construct.json; 3 steps
    for name in want:
        assert got[name] == want[name], name
    if name == "shared_use" and level == "L1":  # the data input's gradient: only when it is asked for
        first, last = (json.loads(got[f"dump/step{i}/proc/dump.json"])["data"] for i in (0, 2))
        assert first["Primitive.layer_norm.LayerNorm.0.backward"]["output"][0] is None
        assert last["Primitive.layer_norm.LayerNorm.0.backward"]["output"][0]["shape"] == [4, 8]


def test_cell_outputs_are_handed_on_as_they_are(tmp_path):
    """While ops run synchronously a Cell's output reaches its caller as the very tensor its construct
    returned (a tensor hook on it; MindSpore copies a view each op takes), unless a hook of the step is
    on it already (a Cell returning an inner Cell's output gets a view, whose hook runs first)."""
    import mindspore as ms
    import numpy as np
    from mindspore import mint, nn

    from msprobe.mindspore import PrecisionDebugger

    class Parent(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = mint.nn.Linear(8, 8)
            self.seq = nn.SequentialCell([mint.nn.Linear(8, 8)])
            self.got = []

        def construct(self, x):
            h = self.fc(x)
            w = self.seq(h)
            self.got += [h, w]
            return (w * w).sum()

    net = Parent()
    made = []
    net.fc.register_forward_hook(lambda cell, args, out: made.append(out))  # before msprobe's hooks
    net.seq.cell_list[0].register_forward_hook(lambda cell, args, out: made.append(out))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(tmp_path / "dump")}))
    debugger = PrecisionDebugger(config_path=str(config))
    x = ms.Tensor(np.ones((2, 8), np.float32))
    grad_fn = ms.value_and_grad(lambda a: net(a), None, net.trainable_params())
    debugger.start(net)
    grad_fn(x)
    debugger.stop()
    debugger.step()
    debugger.close()
    assert net.got[0] is made[0]  # fc's output, hooked itself
    assert net.got[1] is not made[1]  # seq returned seq.0's output: a view stands in for it
    data = json.loads(open(glob.glob(str(tmp_path / "dump" / "step0" / "*" / "dump.json"))[0]).read())["data"]
    assert data["Cell.fc.Linear.backward.0"]["input"][0]["shape"] == [2, 8]  # x is not differentiated
    for key in ("Cell.seq.SequentialCell.backward.0", "Cell.seq.0.Linear.backward.0"):
        assert data[key]["input"][0]["shape"] == data[key]["output"][0]["shape"] == [2, 8], key


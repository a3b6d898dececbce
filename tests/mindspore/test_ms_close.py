"""close() lets go of the network and ends the writer threads: a closed MindSpore debugger keeps no
reference to it (its exit hook used to keep the debugger, and so the network, alive for the whole
process)."""

import gc
import os
import threading
import weakref

import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_closed_debugger_lets_go_of_the_network(models, tmp_path, level):
    from msprobe.mindspore import PrecisionDebugger
    x, y = models.make_data("mlp")
    net = models.build("mlp")
    before = set(threading.enumerate())
    # task tensor: the .npy files are written by the debugger's writer threads
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "a"), task="tensor", level=level)
    try:
        models.train(net, x, y, steps=2, debugger=debugger)
        assert [t for t in set(threading.enumerate()) - before if t.name.startswith("msprobe-writer")]
    finally:
        debugger.close()
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("msprobe-writer")]
    net_ref = weakref.ref(net)
    del net
    gc.collect()
    assert net_ref() is None

    # usable again with a network given to start()
    net = models.build("mlp")
    models.train(net, x, y, steps=1, debugger=debugger)
    debugger.close()
    assert sorted(os.listdir(tmp_path / "a")) == ["step0", "step1", "step2"]


def test_a_debugger_let_go_of_after_its_last_step_frees_the_network(models, tmp_path):
    """Never closed: once the user drops the debugger after step(), nothing else holds it (its exit
    hook is there only while a step is open; MsprobeInitStep finds it through a weak reference)."""
    from msprobe.mindspore import PrecisionDebugger
    x, y = models.make_data("mlp")
    net = models.build("mlp")
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L0")
    models.train(net, x, y, steps=1, debugger=debugger)
    refs = [weakref.ref(net), weakref.ref(debugger)]
    del net, debugger
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_a_step_that_records_nothing_leaves_no_directory(models, tmp_path):
    """The step's files are opened on the writer pool as it starts: a step whose network never ran takes
    them back, and the next step's are where its records are."""
    from msprobe.mindspore import PrecisionDebugger
    x, y = models.make_data("mlp")
    net = models.build("mlp")
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    debugger.start(net)
    debugger.stop()
    debugger.step()
    models.train(net, x, y, steps=1, debugger=debugger)
    debugger.close()
    assert os.listdir(tmp_path) == ["step1"]
    (rank,) = os.listdir(tmp_path / "step1")
    assert sorted(os.listdir(tmp_path / "step1" / rank)) == ["construct.json", "dump.json", "stack.json"]

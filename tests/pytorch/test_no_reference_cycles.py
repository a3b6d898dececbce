"""A dumped step leaves nothing for the cyclic collector: msprobe pauses it from start() to step(), so
a record, tracker or hook caught in a reference cycle would keep tensors alive for the whole step."""

import os

import pytest

import msprobe_test_models as zoo
from cyclic_garbage import cyclic_garbage_of
from msprobe.pytorch import PrecisionDebugger


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("name", ["transformer", "rnn", "inplace"])
def test_dumped_steps_leave_no_reference_cycles(tmp_path, name, level):
    model, data = zoo.build(name), zoo.batches(name, 2)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    try:
        zoo.train(model, data, debugger, steps=1)  # first-call caches (torch, msprobe) made outside the check
        plain = cyclic_garbage_of(zoo.train, model, data, None, 2)
        dumped = cyclic_garbage_of(zoo.train, model, data, debugger, 2)
    finally:
        debugger.close()
    assert not plain  # the model and the training loop make none, so any is msprobe's
    assert not dumped, sorted({kind for kind, _ in dumped})


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_closed_debugger_pins_nothing(tmp_path, level):
    """After close() the debugger holds no reference to the model (its exit hook kept both alive for
    the whole process); start(model) takes it up again."""
    import gc
    import weakref

    model, data = zoo.build("cnn"), zoo.batches("cnn", 2)
    debugger = PrecisionDebugger(dump_path=str(tmp_path / "a"), task="tensor", level=level)
    try:
        zoo.train(model, data, debugger, steps=2)
    finally:
        debugger.close()
    model_ref, debugger_ref = weakref.ref(model), weakref.ref(debugger)
    del model, debugger
    gc.collect()
    assert model_ref() is None and debugger_ref() is None

    # a closed debugger is still usable with a model given again
    model = zoo.build("cnn")
    again = PrecisionDebugger(dump_path=str(tmp_path / "b"), task="statistics", level=level)
    zoo.train(model, data, again, steps=1)
    again.close()
    zoo.train(model, data, again, steps=1)
    again.close()
    assert sorted(os.listdir(tmp_path / "b")) == ["step0", "step1"]

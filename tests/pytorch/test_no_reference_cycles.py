"""A dumped step leaves nothing for the cyclic collector: msprobe pauses it from start() to step(), so
a record, tracker or hook caught in a reference cycle would keep tensors alive for the whole step."""

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

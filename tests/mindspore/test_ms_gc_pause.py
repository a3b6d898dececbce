"""The MindSpore debugger pauses cyclic GC from start() to stop()/step() only (core/gc_pause.py), and
the step is dumped as usual."""

import gc
import os
from collections import Counter

import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")

from msprobe.core.dump.reader import DumpReader  # noqa: E402


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_paused_from_start_to_stop(models, tmp_path, level):
    from mindspore import mint

    from msprobe.mindspore import PrecisionDebugger
    gc.enable()
    net = models.build("mlp")
    x, y = (ms.Tensor(a) for a in models.make_data("mlp"))
    grad_fn = ms.value_and_grad(lambda xb, yb: mint.mean((net(xb) - yb) ** 2), None, net.trainable_params())
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    try:
        debugger.start(net)
        assert not gc.isenabled()
        grad_fn(x, y)
        debugger.stop()
        assert gc.isenabled()
        debugger.start(net)
        assert not gc.isenabled()
        debugger.step()  # step() without stop() ends the pause too
        assert gc.isenabled()
    finally:
        debugger.close()
        gc.enable()
    r = DumpReader(os.path.join(tmp_path, "step0", f"proc{os.getpid()}"))
    assert any(".backward" in k for k in r.keys())


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_dumped_steps_leave_no_reference_cycles(models, tmp_path, level):
    """With the collector paused for the step, anything msprobe left in a cycle would stay alive until
    step(); strided views (the transformer's chunks and transposes) once made a ctypes type each."""
    from cyclic_garbage import cyclic_garbage_of

    from msprobe.mindspore import PrecisionDebugger
    net = models.build("transformer")
    x, y = models.make_data("transformer")
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    try:
        models.train(net, x, y, steps=1, debugger=debugger)  # first-call caches made outside the check
        plain = cyclic_garbage_of(models.train, net, x, y, 2)
        dumped = cyclic_garbage_of(models.train, net, x, y, 2, debugger)
    finally:
        debugger.close()
    # MindSpore leaves a few cycles of its own (a new optimizer's Tensor.init_data); more is msprobe's
    extra = Counter(kind for kind, _ in dumped) - Counter(kind for kind, _ in plain)
    assert not extra


def test_step_after_stop_closes_the_session_with_the_collector_paused(models, tmp_path):
    """stop() resumes the collector; step() pauses it again while the step's session closes (a
    collection there would walk the records the close frees) and resumes it after."""
    from mindspore import mint

    from msprobe.mindspore import PrecisionDebugger
    gc.enable()
    net = models.build("mlp")
    x, y = (ms.Tensor(a) for a in models.make_data("mlp"))
    grad_fn = ms.value_and_grad(lambda xb, yb: mint.mean((net(xb) - yb) ** 2), None, net.trainable_params())
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    seen = []

    def closing(*args, **kwargs):
        seen.append(gc.isenabled())
        return close(*args, **kwargs)
    try:
        debugger.start(net)
        grad_fn(x, y)
        debugger.stop()
        assert gc.isenabled()
        session = debugger._session
        close = session.close
        session.close = closing
        debugger.step()
        assert seen == [False] and gc.isenabled()
    finally:
        debugger.close()
        gc.enable()


@pytest.mark.parametrize("level", ["L0", "L1"])
def test_trackers_alive_after_the_step_hold_no_records(models, tmp_path, level):
    """MindSpore's grad graph keeps the backward hooks, and so their GradTrackers, until the next step:
    those that emitted hold none of their records (which would otherwise outlive the step they were written
    in, and be walked by the collector resumed after it)."""
    from msprobe.mindspore import PrecisionDebugger
    from msprobe.mindspore.capture.backward import GradTracker
    net = models.build("transformer")
    x, y = models.make_data("transformer")
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    try:
        models.train(net, x, y, steps=2, debugger=debugger)
        gc.collect()
        fired = [o for o in gc.get_objects() if type(o) is GradTracker and o.fired]
        assert fired  # (this checks something only while MindSpore keeps them)
        assert all(t.out_recs is None and t.in_recs is None and t.waits is None and t.in_keys is None
                   for t in fired)
    finally:
        debugger.close()

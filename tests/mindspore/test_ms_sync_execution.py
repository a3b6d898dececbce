"""While the MindSpore debugger captures on a CPU target, ops run synchronously (sync_execution.py):
pynative_synchronize on and the frontend and bprop queues bypassed; the user's settings are back after
stop(), and the numbers are the same."""

import numpy as np
import pytest

ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")


def _synchronous():
    return bool(ms.get_context("pynative_synchronize"))


def _queues_bypassed():
    """Whether MindSpore's frontend and bprop queues are bypassed now (asking bypasses them: undone)."""
    executor = ms.common.api._pynative_executor
    was_off = bool(executor.disable_frontend_and_bprop_pipeline())
    if not was_off:
        executor.enable_frontend_and_bprop_pipeline()
    return was_off


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("user_setting", [False, True])
def test_synchronous_while_capturing_then_restored(models, tmp_path, level, user_setting):
    from mindspore import mint

    from msprobe.mindspore import PrecisionDebugger
    net = models.build("transformer")
    x, y = (ms.Tensor(a) for a in models.make_data("transformer"))
    grad_fn = ms.value_and_grad(lambda xb, yb: mint.mean((net(xb) - yb) ** 2), None, net.trainable_params())
    seen = []
    hook = net.register_forward_hook(lambda cell, args, out: seen.append((_synchronous(), _queues_bypassed())))
    ms.set_context(pynative_synchronize=user_setting)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level=level)
    try:
        debugger.start(net)
        grad_fn(x, y)
        debugger.stop()
        after_stop = _synchronous(), _queues_bypassed()
        debugger.start(net)
        grad_fn(x, y)
        debugger.step()  # step() without stop() restores it too
        after_step = _synchronous(), _queues_bypassed()
    finally:
        debugger.close()
        hook.remove()
        ms.set_context(pynative_synchronize=False)
    assert seen == [(True, True), (True, True)]
    assert after_stop == (user_setting, False) and after_step == (user_setting, False)


def test_same_losses_and_gradients_as_asynchronous_training(models, tmp_path):
    """The dumped run (synchronous) computes exactly what the plain asynchronous run computes."""
    from msprobe.mindspore import PrecisionDebugger
    x, y = models.make_data("transformer")
    plain = models.train(models.build("transformer"), x, y, steps=2)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="mix")
    try:
        dumped = models.train(models.build("transformer"), x, y, steps=2, debugger=debugger)
    finally:
        debugger.close()
    assert not _synchronous()
    np.testing.assert_array_equal(np.array(plain), np.array(dumped))


def test_switching_logs_nothing(models, tmp_path, capfd):
    """set_context(pynative_synchronize=...) logs a deprecation warning on every call; the debugger must
    not print one at every start() and stop()."""
    from msprobe.mindspore import PrecisionDebugger
    x, y = models.make_data("mlp")
    capfd.readouterr()
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    try:
        models.train(models.build("mlp"), x, y, steps=2, debugger=debugger)
    finally:
        debugger.close()
    err = capfd.readouterr().err
    assert "pynative_synchronize" not in err and "launch_blocking" not in err, err


def test_queues_the_user_bypassed_stay_bypassed(models, tmp_path):
    """A user who bypassed the queues (as MindSpore's saved_tensors_hooks does) keeps them bypassed: the
    debugger turns back on only what it turned off."""
    from mindspore import mint

    from msprobe.mindspore import PrecisionDebugger
    net = models.build("mlp")
    x, y = (ms.Tensor(a) for a in models.make_data("mlp"))
    grad_fn = ms.value_and_grad(lambda xb, yb: mint.mean((net(xb) - yb) ** 2), None, net.trainable_params())
    executor = ms.common.api._pynative_executor
    executor.disable_frontend_and_bprop_pipeline()
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    try:
        debugger.start(net)
        grad_fn(x, y)
        debugger.stop()
        still_bypassed = _queues_bypassed()
    finally:
        debugger.close()
        executor.enable_frontend_and_bprop_pipeline()
    assert still_bypassed
    assert not _queues_bypassed()

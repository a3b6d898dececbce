"""A debugger that is not capturing costs a training step nothing: constructed and never started, or
between dumped steps, it leaves torch exactly as it was (no mode, no patched function, no global or
module hook, no thread), and nothing but the user holds it. The benchmark's `created` row measures
this with a clock; these tests check it without one."""

import gc
import os
import threading
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.nn.modules.module as module_hooks
import torch.optim.optimizer as optimizer_hooks
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import msprobe_test_models as models
from msprobe.core.dump import flusher
from msprobe.pytorch import PrecisionDebugger


def torch_state(model=None):
    """Everything through which msprobe could slow a step down, as comparable values."""
    publics = {}
    for owner in (torch, F, torch.Tensor, dist):
        for name, value in vars(owner).items():
            if not name.startswith("_") and callable(value):
                publics[(owner.__name__, name)] = id(value)
    state = {
        "functions": publics,
        "function_modes": len(_get_current_function_mode_stack()),
        "dispatch_modes": len(_get_current_dispatch_mode_stack()),
        "global_module_hooks": [len(getattr(module_hooks, n)) for n in dir(module_hooks)
                                if n.startswith("_global_") and n.endswith("hooks")],
        "optimizer_hooks": (len(optimizer_hooks._global_optimizer_pre_hooks),
                            len(optimizer_hooks._global_optimizer_post_hooks)),
        "threads": sorted(t.name for t in threading.enumerate()),
    }
    if model is not None:
        state["model_hooks"] = [
            (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks)) for m in model.modules()]
        state["param_hooks"] = [len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
                                for p in model.parameters()]
    return state


def test_a_debugger_never_started_changes_nothing(tmp_path):
    model, data = models.build("cnn"), models.batches("cnn", 1)
    models.train(model, data, steps=1)  # torch's own first-use work (its first optimizer imports dynamo)
    flusher.release()  # (as below: a thread an earlier test left would end between the two states)
    before = torch_state(model)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="mix")
    models.train(model, data, steps=1)  # a training step, the debugger never started
    assert torch_state(model) == before
    assert not list(tmp_path.iterdir())  # and it wrote nothing
    debugger_ref = weakref.ref(debugger)
    del debugger
    gc.collect()
    assert debugger_ref() is None  # no exit hook held it


def test_between_dumped_steps_nothing_is_left_on(tmp_path):
    """step=[0, 2], level mix: after step 0 and after step 2 torch is as it was before the first
    start() (step 1 and 3 train without the tool); the exit hook is kept only while a step is open."""
    model, data = models.build("cnn"), models.batches("cnn", 2)
    models.train(model, data, steps=1)  # torch's own first-use work
    flusher.release()  # an earlier test's flusher thread, lingering after its last session (flusher.py)
    before = torch_state(model)
    dbg, dump_path = models.make_debugger(tmp_path, "mix", "statistics", common={"step": [0, 2]})
    after_step = []
    for i in range(4):
        models.train(model, [data[i % 2]], dbg, steps=1)
        after_step.append(torch_state(model))
    for i, state in enumerate(after_step):
        assert state == before, i
    assert sorted(os.listdir(dump_path)) == ["step0", "step2"]
    # never closed, yet nothing holds it once the user lets go: its exit hook is only there while a
    # step is open
    dbg_ref = weakref.ref(dbg)
    del dbg
    gc.collect()
    assert dbg_ref() is None

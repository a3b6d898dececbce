"""Callbacks for `mindspore.train.Model.train`: MsprobeStep drives start/stop/step per training step;
MsprobeInitStep sets the debugger's first step from the step a resumed run starts at."""

from mindspore.train import Callback

from msprobe.core.errors import MsprobeError
from msprobe.mindspore import _state


class MsprobeStep(Callback):
    """start() at each step begin, stop() and step() at each step end.

    Args:
        debugger: the PrecisionDebugger; call `debugger.start(model)` once before `Model.train` for L0,
            mix, and Primitive ops at L1 (the model is remembered).
    """

    def __init__(self, debugger):
        super().__init__()
        self.debugger = debugger

    def on_train_step_begin(self, run_context):
        self.debugger.start()

    def on_train_step_end(self, run_context):
        self.debugger.stop()
        self.debugger.step()


class MsprobeInitStep(Callback):
    """Sets the PrecisionDebugger's step to the step the (resumed) training starts at."""

    def on_train_begin(self, run_context):
        debugger = _state.debugger() if _state.debugger is not None else None
        if debugger is None:
            raise MsprobeError("MsprobeInitStep: create a PrecisionDebugger before Model.train")
        params = run_context.original_args()
        start = getattr(params, "cur_step_num", 0) or 0
        debugger.set_init_step(int(start))

"""msprobe's own tensor reads (statistics, records, backward bookkeeping) go through no
`__torch_function__` handler: not the L1 capture mode's (each read through its Python handler cost
~1.5 us, a tensor's statistics 19 us instead of 3), and not a mode the user entered before start()
(a tracing or FLOP-counting mode must see the model's calls only)."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

from msprobe.core.dump.reader import DumpReader, find_rank_dirs
from msprobe.pytorch import PrecisionDebugger
import msprobe_test_models as models  # loaded by conftest.py

# methods the models never call and msprobe's statistics always do
TOOL_ONLY = {torch.Tensor.data_ptr, torch.Tensor.untyped_storage, torch.Tensor.is_inference}


class Recorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("device_path", [False, True], ids=["host", "device"])
@pytest.mark.parametrize("level", ["L1", "mix"])
def test_user_mode_sees_no_tool_reads(tmp_path, monkeypatch, level, device_path):
    """On the device path too: its in-place calls ask which waiting summaries share their memory."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "1" if device_path else "0")
    model = models.build("transformer")
    data = models.batches("transformer", 1)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), level=level)
    outer = Recorder()
    try:
        with outer:
            models.train(model, data, debugger=dbg, steps=1)
    finally:
        models.finish(dbg)
    tool = [f for f in outer.seen if f in TOOL_ONLY]
    assert not tool, f"{len(tool)} of msprobe's own reads reached the user's mode, e.g. {tool[0]}"
    assert any(f is torch.nn.functional.layer_norm for f in outer.seen)  # the model's calls still do
    r = DumpReader(find_rank_dirs(str(tmp_path))[0].path)
    assert any(k.endswith(".backward") for k in r.keys())

"""msprobe overflow_check on the output of the dump's own `task: overflow_check` (only overflowing calls
are recorded, with their tensors): the first op making inf is still named, not its downstream users."""

import json

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from msprobe.core.dump.reader import DumpReader  # noqa: E402
from msprobe.core.overflow import analyze_overflow  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402


class ExpNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x, scale):
        return self.head(torch.exp(torch.relu(self.fc(x)) * scale))


@pytest.mark.parametrize("overflow_nums", [1, -1])
def test_overflow_task_dump(tmp_path, overflow_nums):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "overflow_check", "dump_path": str(tmp_path / "dump"), "level": "L1",
                                  "overflow_check": {"overflow_nums": overflow_nums}}))
    torch.manual_seed(0)
    model = ExpNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    debugger = PrecisionDebugger(config_path=str(config))
    try:
        for scale in (0.1, 100.0, 100.0):  # step 0 finite, steps 1 and 2 overflow in exp
            debugger.start(model)
            model(torch.randn(4, 8), scale).sum().backward()
            opt.step()
            opt.zero_grad()
            debugger.stop()
            debugger.step()
    finally:
        debugger.close()
    result = analyze_overflow(str(tmp_path / "dump"))
    culprit = result.culprit
    assert (culprit.key, culprit.step, culprit.kind) == ("Torch.exp.0.forward", 1, "origin")
    assert culprit.record["input_args"][0]["Max"] < 1e3 and culprit.record["output"][0]["Max"] == "inf"
    assert any("torch.exp(torch.relu(self.fc(x)) * scale)" in line for line in culprit.stack)
    recorded = DumpReader(culprit.rank_dir).keys()
    if overflow_nums == -1:  # every call with inf/nan was recorded: its users come after exp, not named
        assert recorded[0] == "Torch.exp.0.forward" and "Functional.linear.1.forward" in recorded
    else:
        assert recorded == ["Torch.exp.0.forward"]

"""Helpers of the compare tests (tests/compare, tests/core/compare, tests/core/diagnosis): hand-written
dump.json files and the msProbe samples' location.
(A uniquely named module: `conftest` is ambiguous when several test folders have one.)"""

import json
import os

# a copy of msProbe's sample outputs (CI clones the repository without the shared folder)
SAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "msprobe-samples")


_SAME = object()


def tensor(mx, mn=_SAME, mean=_SAME, norm=_SAME, dtype="torch.float32", shape=(4,), rg=True, **extra):
    """A tensor record; unspecified statistics equal Max (None means absent, as in integer dumps)."""
    rec = {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape), "Max": mx,
           "Min": mx if mn is _SAME else mn, "Mean": mx if mean is _SAME else mean,
           "Norm": mx if norm is _SAME else norm}
    if rg is not None:
        rec["requires_grad"] = rg
    rec.update(extra)
    return rec


def write_dump(folder, data, task="statistics", framework="pytorch", level="L1", step=0, rank=0, stack=None):
    """Write `folder/step{step}/rank{rank}/dump.json` (and stack.json) and return the rank dir."""
    rank_dir = os.path.join(str(folder), f"step{step}", f"rank{rank}")
    os.makedirs(rank_dir, exist_ok=True)
    with open(os.path.join(rank_dir, "dump.json"), "w") as f:
        json.dump({"task": task, "level": level, "framework": framework, "dump_data_dir": None, "data": data}, f)
    if stack is not None:
        with open(os.path.join(rank_dir, "stack.json"), "w") as f:
            json.dump(stack, f)
    return rank_dir

"""Fixtures of the compare tests: real PyTorch dumps (runs.py) and hand-written dump.json files."""

from pathlib import Path
import importlib.util
import json
import os
import sys

import pytest

SAMPLES = str(Path(__file__).resolve().parents[1] / "data" / "msprobe-samples")


def _load_runs():
    name = "msprobe_compare_test_runs"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), "runs.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def runs():
    return _load_runs()


@pytest.fixture(scope="session")
def dumps(tmp_path_factory, runs):
    """dumps(variant, task, steps=1) -> dump root of a real one-step training run (cached)."""
    root = tmp_path_factory.mktemp("dumps")
    return lambda variant, task, **kw: runs.dump(root, variant, task, **kw)


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


@pytest.fixture
def make_pair(tmp_path):
    """make_pair(target_data, golden_data, **kw) -> (target rank dir, golden rank dir)."""
    def make(target, golden, target_kw=None, golden_kw=None, **kw):
        t = write_dump(tmp_path / "target", target, **{**kw, **(target_kw or {})})
        g = write_dump(tmp_path / "golden", golden, **{**kw, **(golden_kw or {})})
        return t, g
    return make

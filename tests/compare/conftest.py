"""Fixtures of the compare tests: real PyTorch dumps (runs.py) and hand-written dump.json files."""

import os

import pytest

from compare_fixtures import write_dump
from private_modules import load_private


def _load_runs():
    return load_private("msprobe_compare_test_runs", os.path.join(os.path.dirname(__file__), "runs.py"))


@pytest.fixture(scope="session")
def runs():
    return _load_runs()


@pytest.fixture(scope="session")
def dumps(tmp_path_factory, runs):
    """dumps(variant, task, steps=1) -> dump root of a real one-step training run (cached)."""
    root = tmp_path_factory.mktemp("dumps")
    return lambda variant, task, **kw: runs.dump(root, variant, task, **kw)


@pytest.fixture
def make_pair(tmp_path):
    """make_pair(target_data, golden_data, **kw) -> (target rank dir, golden rank dir)."""
    def make(target, golden, target_kw=None, golden_kw=None, **kw):
        t = write_dump(tmp_path / "target", target, **{**kw, **(target_kw or {})})
        g = write_dump(tmp_path / "golden", golden, **{**kw, **(golden_kw or {})})
        return t, g
    return make

"""Fixtures of the acc_check tests: real dumps of the PyTorch and MindSpore model zoos (made once per
session), and the zoo modules loaded by path under private names."""

import os

import pytest

from acc_fixtures import dump_json_of
from private_modules import load_private

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)


@pytest.fixture(scope="session")
def pt_models():
    return load_private("msprobe_acc_pt_models", os.path.join(TESTS, "pytorch", "models.py"))


@pytest.fixture(scope="session")
def ms_models():
    pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
    return load_private("msprobe_acc_ms_models", os.path.join(TESTS, "mindspore", "models.py"))


@pytest.fixture(scope="session")
def pt_dumps(tmp_path_factory, pt_models):
    """{task: dump.json} of the PyTorch transformer block, L1, statistics and tensor."""
    out = {}
    for task in ("statistics", "tensor"):
        tmp = tmp_path_factory.mktemp(f"pt_{task}")
        run = pt_models.run_dump(tmp, "transformer", "L1", task)
        out[task] = dump_json_of(run.dump_path)
    return out


@pytest.fixture(scope="session")
def ms_dumps(tmp_path_factory, ms_models):
    """{task: dump.json} of the MindSpore transformer block, L1, statistics and tensor."""
    out = {}
    for task in ("statistics", "tensor"):
        tmp = tmp_path_factory.mktemp(f"ms_{task}")
        root, _ = ms_models.run_dump(tmp, "transformer", "L1", task=task, steps=1)
        out[task] = dump_json_of(root)
    return out

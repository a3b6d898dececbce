import os
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from msprobe.core.errors import ConfigError
from msprobe.pytorch.seed import restore_dropout, seed_all


@pytest.fixture(autouse=True)
def _restore_global_state(monkeypatch):
    """Leave the process as the test found it: env vars, flags, RNG states, dropout."""
    # Recording through monkeypatch makes it restore these on teardown.
    for var in ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG"):
        if var in os.environ:
            monkeypatch.setenv(var, os.environ[var])
        else:
            monkeypatch.delenv(var, raising=False)
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        yield
    finally:
        restore_dropout()
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _draw():
    return torch.randn(5), np.random.rand(5), random.random()


def test_same_seed_gives_same_values():
    seed_all(7)
    t1, n1, r1 = _draw()
    seed_all(7)
    t2, n2, r2 = _draw()
    assert torch.equal(t1, t2)
    assert np.array_equal(n1, n2)
    assert r1 == r2


def test_different_seeds_give_different_values():
    seed_all(7)
    t1, n1, r1 = _draw()
    seed_all(8)
    t2, n2, r2 = _draw()
    assert not torch.equal(t1, t2)
    assert not np.array_equal(n1, n2)
    assert r1 != r2


def test_sets_pythonhashseed_and_cudnn_flags():
    seed_all(42)
    assert os.environ["PYTHONHASHSEED"] == "42"
    assert torch.backends.cudnn.deterministic is True
    assert torch.backends.cudnn.benchmark is False


def test_mode_true_enables_deterministic_algorithms():
    torch.use_deterministic_algorithms(False)
    try:
        seed_all(1, mode=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(False)


def test_mode_true_keeps_existing_cublas_config(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    try:
        seed_all(1, mode=True)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(False)


def test_mode_false_leaves_deterministic_algorithms_alone():
    torch.use_deterministic_algorithms(False)
    seed_all(1)
    assert not torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        seed_all(1)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_rm_dropout_makes_dropout_identity_and_restore_brings_it_back():
    x = torch.ones(1000)
    drop = nn.Dropout(0.5)  # created before seed_all: must be affected too
    drop.train()
    seed_all(3, rm_dropout=True)
    assert torch.equal(drop(x), x)
    assert torch.equal(F.dropout(x, 0.5, training=True), x)
    assert torch.equal(F.dropout(x, p=0.5, training=True), x)
    x4 = torch.ones(2, 8, 4, 4)
    assert torch.equal(F.dropout2d(x4, 0.5, training=True), x4)
    assert torch.equal(nn.AlphaDropout(0.5).train()(x), x)

    restore_dropout()
    out = drop(x)
    assert not torch.equal(out, x)
    assert (out == 0).any()
    assert not torch.equal(F.dropout(x, 0.5, training=True), x)


def test_rm_dropout_twice_does_not_double_wrap():
    original = F.dropout
    originals = {name: getattr(F, name) for name in ("dropout2d", "alpha_dropout")}
    seed_all(rm_dropout=True)
    wrapped = F.dropout
    assert wrapped is not original
    seed_all(rm_dropout=True)
    assert F.dropout is wrapped
    assert wrapped.__wrapped__ is original
    assert wrapped.__name__ == original.__name__
    restore_dropout()
    assert F.dropout is original
    for name, fn in originals.items():
        assert getattr(F, name) is fn


def test_restore_dropout_without_removal_is_noop():
    original = F.dropout
    restore_dropout()
    assert F.dropout is original


def test_logs_one_line(caplog):
    with caplog.at_level("INFO", logger="msprobe.pytorch.seed"):
        seed_all(5)
    records = [r for r in caplog.records if r.name == "msprobe.pytorch.seed"]
    assert len(records) == 1
    assert "seed=5" in records[0].getMessage()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"seed": -1}, "seed"),
        ({"seed": 2**32}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"seed": True}, "seed"),
        ({"mode": 1}, "mode"),
        ({"mode": "yes"}, "mode"),
        ({"rm_dropout": 0}, "rm_dropout"),
        ({"rm_dropout": None}, "rm_dropout"),
    ],
)
def test_invalid_args_raise_config_error(kwargs, field):
    with pytest.raises(ConfigError) as excinfo:
        seed_all(**kwargs)
    assert excinfo.value.field == field
    assert f"'{field}'" in str(excinfo.value)


def test_boundary_seeds_accepted():
    seed_all(0)
    seed_all(2**32 - 1)

"""Reproducible randomness for MindSpore runs: `seed_all` seeds Python `random`, numpy, MindSpore's
global seed (initializers, random ops) and the hash seed; `mode=True` turns on deterministic kernels;
`rm_dropout=True` makes the dropout APIs identities (before the dropout Cells are built)."""

import functools
import logging
import os
import random

import mindspore as ms
import numpy as np

from msprobe.core.errors import ConfigError

logger = logging.getLogger(__name__)

_MAX_SEED = 2**32 - 1
_ORIGINAL = {}  # (owner, name) -> original, for every dropout API replaced


def seed_all(seed=1234, mode=False, rm_dropout=False):
    """Seed every RNG a MindSpore training script touches.

    Args:
        seed: integer in [0, 2**32 - 1].
        mode: enable deterministic computing (`mindspore.set_deterministic`), also for reduction
            collectives (HCCL_DETERMINISTIC).
        rm_dropout: make ops.Dropout/Dropout2D/Dropout3D, mint.nn.Dropout and
            mint.nn.functional.dropout do nothing (call before the dropout instances are built).

    Raises:
        ConfigError: a bad argument.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ConfigError("seed", seed, f"an integer in [0, {_MAX_SEED}]")
    for name, value in (("mode", mode), ("rm_dropout", rm_dropout)):
        if not isinstance(value, bool):
            raise ConfigError(name, value, "true | false")
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)
    if mode and ms.get_context("deterministic") != "ON":  # MindSpore refuses to set it twice
        ms.set_deterministic(True)
        os.environ["HCCL_DETERMINISTIC"] = "true"
    if rm_dropout:
        remove_dropout()


def _identity_function(original):
    # the identity itself, not p=0: the CPU build has no dropout kernel even for p=0
    @functools.wraps(original)
    def dropout(input, *args, **kwargs):  # pylint: disable=redefined-builtin,unused-argument
        return input
    return dropout


def _zero_rate_cell(cls, rate_param):
    """A patched `cls.__init__` that builds the Cell/Primitive with nothing dropped."""
    import inspect
    original = cls.__init__
    signature = inspect.signature(original)
    no_drop = 1.0 if rate_param == "keep_prob" else 0.0

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.arguments[rate_param] = no_drop
        original(*bound.args, **bound.kwargs)
    return original, __init__


def remove_dropout():
    """Replace the dropout APIs by identities (idempotent)."""
    from mindspore import mint, ops
    fn_owner = mint.nn.functional
    if (fn_owner, "dropout") not in _ORIGINAL:
        _ORIGINAL[(fn_owner, "dropout")] = fn_owner.dropout
        fn_owner.dropout = _identity_function(fn_owner.dropout)
    # Primitives/Cells: keep_prob=1.0 (ops.Dropout*) or p=0 (mint.nn.Dropout)
    for cls, param in ((ops.Dropout, "keep_prob"), (ops.Dropout2D, "keep_prob"), (ops.Dropout3D, "keep_prob"),
                       (mint.nn.Dropout, "p")):
        if (cls, "__init__") in _ORIGINAL:
            continue
        original, patched = _zero_rate_cell(cls, param)
        _ORIGINAL[(cls, "__init__")] = original
        cls.__init__ = patched


def restore_dropout():
    """Undo `seed_all(rm_dropout=True)`."""
    for (owner, name), original in _ORIGINAL.items():
        setattr(owner, name, original)
    _ORIGINAL.clear()

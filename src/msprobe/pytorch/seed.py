"""Reproducible randomness for PyTorch runs.

This module owns :func:`seed_all`, which seeds every random number generator a
PyTorch training script usually touches (Python ``random``, ``numpy.random``,
torch CPU and CUDA), optionally turns on deterministic algorithms, and
optionally makes dropout an identity; and :func:`restore_dropout`, which undoes
the dropout change. It also owns the module-level record of the original
``torch.nn.functional`` dropout functions it replaced.
"""

import functools
import logging
import os
import random

import numpy as np
import torch
import torch.nn.functional as F

from msprobe.core.errors import ConfigError

logger = logging.getLogger(__name__)

_MAX_SEED = 2**32 - 1

# Names of the torch.nn.functional dropout functions that rm_dropout replaces.
_DROPOUT_FUNCTIONS = (
    "dropout",
    "dropout1d",
    "dropout2d",
    "dropout3d",
    "alpha_dropout",
    "feature_alpha_dropout",
)

# name -> original function, for every dropout function currently replaced.
_ORIGINAL_DROPOUT = {}


def _no_dropout(original):
    """Return a wrapper of ``original`` that always runs it with ``p=0.0``."""

    @functools.wraps(original)
    def wrapper(input, p=0.5, *args, **kwargs):  # pylint: disable=redefined-builtin,unused-argument
        return original(input, 0.0, *args, **kwargs)

    return wrapper


def _remove_dropout():
    """Replace the dropout functions of torch.nn.functional by p=0.0 wrappers, once."""
    for name in _DROPOUT_FUNCTIONS:
        if name in _ORIGINAL_DROPOUT:
            continue
        original = getattr(F, name, None)
        if original is None:
            continue
        _ORIGINAL_DROPOUT[name] = original
        setattr(F, name, _no_dropout(original))


def restore_dropout():
    """Put back the original torch.nn.functional dropout functions.

    Undoes ``seed_all(rm_dropout=True)``. Does nothing if dropout was not removed.

    Example:
        >>> import torch
        >>> from msprobe.pytorch.seed import seed_all, restore_dropout
        >>> seed_all(rm_dropout=True)
        >>> x = torch.ones(4)
        >>> bool(torch.equal(torch.nn.functional.dropout(x, 0.5, training=True), x))
        True
        >>> restore_dropout()
    """
    for name, original in list(_ORIGINAL_DROPOUT.items()):
        setattr(F, name, original)
        del _ORIGINAL_DROPOUT[name]


def _check_args(seed, mode, rm_dropout):
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ConfigError("seed", seed, f"an integer in [0, {_MAX_SEED}]")
    if not isinstance(mode, bool):
        raise ConfigError("mode", mode, "True or False")
    if not isinstance(rm_dropout, bool):
        raise ConfigError("rm_dropout", rm_dropout, "True or False")


def seed_all(seed=1234, mode=False, rm_dropout=False):
    """Seed every random number generator and optionally make PyTorch deterministic.

    Seeds Python ``random``, ``numpy.random``, ``torch.manual_seed`` and, when
    CUDA is available, ``torch.cuda.manual_seed_all``; sets
    ``os.environ['PYTHONHASHSEED']`` (this affects child processes only, not the
    hash seed of the running interpreter); and sets
    ``torch.backends.cudnn.deterministic = True`` and
    ``torch.backends.cudnn.benchmark = False``.

    ``rm_dropout=True`` deliberately replaces ``dropout``, ``dropout1d``,
    ``dropout2d``, ``dropout3d``, ``alpha_dropout`` and ``feature_alpha_dropout``
    in ``torch.nn.functional`` by wrappers that call the original with
    ``p=0.0``. This affects every dropout call made through
    ``torch.nn.functional`` after this call, process-wide, including the
    ``nn.Dropout*`` modules created before it. Calling it again does not wrap
    twice; :func:`restore_dropout` puts the originals back.

    Args:
        seed: seed for all generators, an int in ``[0, 2**32 - 1]``.
        mode: if True, call ``torch.use_deterministic_algorithms(True)`` and set
            ``CUBLAS_WORKSPACE_CONFIG=':4096:8'`` when it is not set already
            (CUDA requires it). If False, the deterministic-algorithms setting
            is left as it is.
        rm_dropout: if True, make dropout an identity as described above.

    Raises:
        ConfigError: ``seed`` is not an int (bools are refused) in range, or
            ``mode`` or ``rm_dropout`` is not a bool.

    Example:
        >>> import torch
        >>> from msprobe.pytorch.seed import seed_all
        >>> seed_all(7)
        >>> a = torch.randn(3)
        >>> seed_all(7)
        >>> bool(torch.equal(a, torch.randn(3)))
        True
    """
    _check_args(seed, mode, rm_dropout)

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.manual_seed_all(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False

    if mode:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)

    if rm_dropout:
        _remove_dropout()

    logger.info(
        "seed_all: seed=%d (random, numpy, torch%s, PYTHONHASHSEED), cudnn deterministic, "
        "deterministic algorithms %s, dropout %s",
        seed,
        ", cuda" if cuda else "",
        "on" if mode else "unchanged",
        "removed" if rm_dropout else "unchanged",
    )

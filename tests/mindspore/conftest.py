"""Shared fixtures of the MindSpore tests. They need MindSpore 2.10 (installed by `make setup` from the
`mindspore` extra, so CI runs them); only where it really cannot be imported are they skipped, with the
import error as the reason."""

import os

import pytest

from private_modules import load_private


def _load_models():
    """tests/mindspore/models.py under a private name (no package, no clash with other test dirs)."""
    return load_private("msprobe_ms_test_models", os.path.join(os.path.dirname(__file__), "models.py"))


@pytest.fixture(scope="session")
def models():
    pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
    return _load_models()

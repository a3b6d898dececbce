"""Shared fixtures of the MindSpore tests. They need MindSpore 2.10 (installed by `make setup` from the
`mindspore` extra, so CI runs them); only where it really cannot be imported are they skipped, with the
import error as the reason."""

import importlib.util
import os
import sys

import pytest


def _load_models():
    """tests/mindspore/models.py under a private name (no package, no clash with other test dirs)."""
    name = "msprobe_ms_test_models"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), "models.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="session")
def models():
    pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")
    return _load_models()

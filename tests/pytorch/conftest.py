"""Loads tests/pytorch/models.py once, as the module `msprobe_test_models` (a private name: no
package, no clash with tests/mindspore/models.py); the test files here `import msprobe_test_models`."""

import os

import pytest

from private_modules import load_private

load_private("msprobe_test_models", os.path.join(os.path.dirname(__file__), "models.py"))


@pytest.fixture
def host_path(monkeypatch):
    """The host path whatever MSPROBE_DEVICE_SUMMARY says: a test of the host path's own parts (its kernel,
    cache, C record and pass-on handler). The rest of tests/pytorch holds on either path:
    `MSPROBE_DEVICE_SUMMARY=1 pytest tests/pytorch` runs it on the accelerator's path."""
    monkeypatch.setenv("MSPROBE_DEVICE_SUMMARY", "0")

"""Helper files of the tests (tests/*/models.py, runs.py ...) loaded under private module names:
tests/ has no packages, and tests/pytorch and tests/mindspore both have a models.py. tests/ is on
sys.path through pyproject's `pythonpath`."""

import importlib.util
import sys


def load_private(name, path):
    """The file `path` as the module `name`, executed once per test process."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]

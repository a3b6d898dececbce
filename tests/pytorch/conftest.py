"""Loads tests/pytorch/models.py once, as the module `msprobe_test_models` (a private name: no
package, no clash with tests/mindspore/models.py); the test files here `import msprobe_test_models`."""

import importlib.util
import os
import sys

_NAME = "msprobe_test_models"
if _NAME not in sys.modules:
    _spec = importlib.util.spec_from_file_location(_NAME, os.path.join(os.path.dirname(__file__), "models.py"))
    _module = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = _module
    _spec.loader.exec_module(_module)

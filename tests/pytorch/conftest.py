"""Loads tests/pytorch/models.py once, as the module `msprobe_test_models` (a private name: no
package, no clash with tests/mindspore/models.py); the test files here `import msprobe_test_models`."""

import os

from private_modules import load_private

load_private("msprobe_test_models", os.path.join(os.path.dirname(__file__), "models.py"))

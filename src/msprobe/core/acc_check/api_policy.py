"""What acc_check agrees to run: the framework's operators and the user's own custom APIs, never the
standard library, I/O or serialization functions, whatever a dump.json or api_sources.json names.

A dump may come from another machine or team, and its names are only strings: `Torch.save` with two
string arguments, or an api_sources.json entry pointing at `os.system`, would otherwise be called with
the file's arguments. The adapters decide what an operator of their framework is (`is_operator`);
this module refuses what no operator namespace can hold. Must not import torch or mindspore.
"""

import re
import sys

# Package roots never imported or run for a name a file gives: serialization, I/O and process tools
# outside the standard library (which is refused whole).
FOREIGN_ROOTS = frozenset({
    "numpy", "pandas", "scipy", "h5py", "safetensors", "joblib", "dill", "cloudpickle", "yaml", "requests",
    "urllib3", "httpx", "setuptools", "pip", "pkg_resources", "IPython", "transformers", "huggingface_hub",
    "tensorboard", "matplotlib", "msprobe", "pytest", "_pytest", "psutil", "sh", "fabric", "paramiko",
})
FRAMEWORK_ROOTS = frozenset({"torch", "mindspore"})
# Names an operator never has; a second check on the framework fallbacks (getattr on a namespace).
SIDE_EFFECT_NAME = re.compile(r"(?i)file|save|load|dump|summary|pyfunc|pyexecute|print|hook|offload|"
                              r"callback|pickle|exec|eval|system|spawn|popen|^open|custom")


class RefusedApi(Exception):
    """The name resolves to something acc_check never runs; the message says what and why."""


def module_root(name):
    return (name or "").split(".", 1)[0]


def origin_of(func):
    """The module a callable comes from (a bound builtin's owner module, a class's module)."""
    module = getattr(func, "__module__", None)
    if module is None:
        owner = getattr(func, "__self__", None)
        module = getattr(owner, "__module__", None) or getattr(owner, "__name__", None)
    if module is None:
        module = type(func).__module__
    return module if isinstance(module, str) else ""


def is_foreign_module(name):
    """Standard library or a non-operator library (see FOREIGN_ROOTS)."""
    root = module_root(name)
    return root in sys.stdlib_module_names or root in FOREIGN_ROOTS or root.startswith("_") and \
        root.lstrip("_") in sys.stdlib_module_names


def refuse(dump_name, target, why):
    return RefusedApi(f"refused: {dump_name} names {target}, {why}; acc_check runs only the framework's "
                      "operators and custom APIs (see docs/safety.md)")


def check_recorded_module(dump_name, module):
    """Before importing the module an api_sources.json entry names."""
    if is_foreign_module(module):
        raise refuse(dump_name, f"module {module!r}", "which is not an operator library")


def check_callable(dump_name, func, is_operator):
    """The resolved callable of a custom API recorded in a file: not from a foreign module, and when it
    is the framework's, one of its operators (`is_operator(func)`)."""
    origin = origin_of(func)
    qual = getattr(func, "__qualname__", getattr(func, "__name__", type(func).__name__))
    if is_foreign_module(origin):
        raise refuse(dump_name, f"{origin}.{qual}", "which is not an operator")
    if module_root(origin) in FRAMEWORK_ROOTS and not is_operator(func):
        raise refuse(dump_name, f"{origin}.{qual}", "which is not one of the framework's operators")

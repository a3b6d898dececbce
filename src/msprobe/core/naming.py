"""The dump key grammar (msprobe-facts §3.3). Every key string is built and parsed here, nowhere else.

API call:      {Prefix}.{api}.{n}.{forward|backward}            Functional.linear.0.forward
Module call:   {Module|Cell}.{path}.{Class}.{forward|backward}.{n}   Module.conv1.Conv2d.forward.0
Param grads:   {Module|Cell}.{path}.{Class}.parameters_grad.{n}
Param update:  Optimizer.{OptimizerClass}.{parameter name}.{n}.forward   Optimizer.SGD.fc.weight.0.forward
Single point:  {name}[_grad].{n}.debug
Tensor file:   {key}.{input|output}.{i}[.{j}...]{suffix}; parameters: {key}.parameters.{name}{suffix}

Must not import torch or mindspore.
"""

import functools
from collections import defaultdict

FORWARD, BACKWARD = "forward", "backward"
MODULE_PREFIXES = ("Module", "Cell")
OPTIMIZER_PREFIX = "Optimizer"


def api_key(prefix, api_name, index, direction):
    return f"{prefix}.{api_name}.{index}.{direction}"


def module_key(prefix, path, class_name, direction, index):
    return f"{prefix}.{path}.{class_name}.{direction}.{index}"


def params_grad_key(prefix, path, class_name, index):
    return f"{prefix}.{path}.{class_name}.parameters_grad.{index}"


@functools.lru_cache(maxsize=None)  # one per module, asked once per step for each
def params_grad_names(base):
    """(its counter's name, its parameters_grad key without the index) for module `base` ("Module.fc.Linear")."""
    prefix, rest = base.split(".", 1)
    path, cls = rest.rsplit(".", 1)
    return base + ".parameters_grad", params_grad_key(prefix, path, cls, "")


def optimizer_update_key(optimizer_class, param_name, index):
    """The record of one parameter's update by an optimizer step (core/dump/optimizer_updates.py)."""
    return api_key(OPTIMIZER_PREFIX, f"{optimizer_class}.{param_name}", index, FORWARD)


def debug_key(name, index, grad=False):
    return f"{name}{'_grad' if grad else ''}.{index}.debug"


def tensor_file_name(key, role, index_path, suffix):
    """`role` is input/output/parameters; `index_path` a tuple of ints or names."""
    parts = ".".join(str(i) for i in index_path)
    return f"{key}.{role}.{parts}{suffix}" if parts else f"{key}.{role}{suffix}"


def debug_file_name(key, index_path, suffix):
    parts = ".".join(str(i) for i in index_path)
    return f"{key}.{parts}{suffix}" if parts else f"{key}{suffix}"


_DOT_FORWARD, _DOT_FORWARD_DOT = "." + FORWARD, f".{FORWARD}."  # built once: asked for every call


def backward_of(forward_key):
    """The backward key of the call whose forward key is given (unchanged for other keys).

    >>> backward_of("Functional.linear.0.forward"), backward_of("Module.fc.Linear.forward.2")
    ('Functional.linear.0.backward', 'Module.fc.Linear.backward.2')
    """
    if forward_key.endswith(_DOT_FORWARD):
        return forward_key[: -len(FORWARD)] + BACKWARD
    head, sep, tail = forward_key.rpartition(_DOT_FORWARD_DOT)
    if sep and tail.isdigit():
        return f"{head}.{BACKWARD}.{tail}"
    return forward_key


def forward_of(key):
    """The forward key of a backward or parameters_grad key (None for other keys).

    >>> forward_of("Functional.linear.0.backward"), forward_of("Module.fc.Linear.parameters_grad.2")
    ('Functional.linear.0.forward', 'Module.fc.Linear.forward.2')
    """
    base, direction, index = split_key(key)
    if direction not in (BACKWARD, "parameters_grad"):
        return None
    prefix, rest = split_base(base)
    rest = rest or ""
    if is_module_key(key):
        path, _, class_name = rest.rpartition(".")
        return module_key(prefix, path, class_name, FORWARD, index)
    return api_key(prefix, rest, index, FORWARD)


def module_parts(key):
    """(prefix, module path, class name) of a module call's or parameters_grad key, None for other keys.

    >>> module_parts("Module.ff.1.ReLU.backward.0")
    ('Module', 'ff.1', 'ReLU')
    """
    base, direction, _ = split_key(key)
    prefix, rest = split_base(base)
    if prefix not in MODULE_PREFIXES or rest is None or direction not in (FORWARD, BACKWARD, "parameters_grad"):
        return None
    path, _, class_name = rest.rpartition(".")
    return prefix, path, class_name


def module_class(key):
    """The class name of a module call's key ('ReLU' of Module.ff.1.ReLU.backward.0), None for other keys."""
    parts = module_parts(key)
    return parts[2] if parts is not None else None


def is_module_key(key):
    return key.split(".", 1)[0] in MODULE_PREFIXES


def split_key(key):
    """Split a key into (base, direction, index) whatever its kind.

    `base` is the key without direction and call index, so forward and backward of one call share it.

    >>> split_key("Functional.linear.3.backward")
    ('Functional.linear', 'backward', 3)
    >>> split_key("Module.conv1.Conv2d.forward.0")
    ('Module.conv1.Conv2d', 'forward', 0)
    """
    parts = key.split(".")
    if len(parts) >= 3 and parts[-1] in (FORWARD, BACKWARD) and parts[-2].isdigit():
        return ".".join(parts[:-2]), parts[-1], int(parts[-2])
    if len(parts) >= 3 and parts[-2] in (FORWARD, BACKWARD, "parameters_grad") and parts[-1].isdigit():
        return ".".join(parts[:-2]), parts[-2], int(parts[-1])
    if len(parts) >= 2 and parts[-1] == "debug" and parts[-2].isdigit():
        return ".".join(parts[:-2]), "debug", int(parts[-2])
    return key, "", -1


def split_base(base):
    """(prefix, rest) of a key's base: ('Functional', 'nn.softmax') of 'Functional.nn.softmax',
    ('Module', 'conv1.Conv2d') of a module's; rest is None for a base without a prefix.

    >>> split_base("Optimizer.SGD.fc.weight")
    ('Optimizer', 'SGD.fc.weight')
    """
    prefix, sep, rest = base.partition(".")
    return prefix, (rest if sep else None)


class CallCounter:
    """Per-name call counters: the n in `Functional.linear.{n}.forward`. Reset at each step."""

    def __init__(self):
        self.counts = defaultdict(int)  # name -> calls so far (also counted by msprobe._call, in place)

    def next(self, name):
        n = self.counts[name]
        self.counts[name] = n + 1
        return n

    def next_api_key(self, prefix, api_name):
        """`api_key(prefix, api_name, next(...), FORWARD)` in one step (asked for every API call)."""
        counted = f"{prefix}.{api_name}"
        n = self.counts[counted]
        self.counts[counted] = n + 1
        return f"{counted}.{n}.{FORWARD}"

    def reset(self):
        self.counts.clear()

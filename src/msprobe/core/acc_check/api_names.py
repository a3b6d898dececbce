"""What both frameworks' API resolvers share: the 'cannot run here' signal, `--custom_api` entries, and
the resolution order (communication ops skipped, custom modules, then the framework's own names)."""

import importlib

from msprobe.core.acc_check.input_spec import COMMUNICATION_PREFIXES
from msprobe.core.errors import MsprobeError


class Unresolvable(Exception):
    """The API cannot be run here; the message says why (it becomes a SKIP row)."""


def parse_custom_apis(entries):
    """('Prefix=python.module', ...) -> {prefix: module}; bad entries are user errors."""
    modules = {}
    for entry in entries or ():
        prefix, sep, path = str(entry).partition("=")
        if not sep or not prefix or not path:
            raise MsprobeError(f"--custom_api {entry!r}: expected PREFIX=python.module, e.g. MyOps=mypkg.ops")
        try:
            modules[prefix] = importlib.import_module(path)
        except ImportError as e:
            raise MsprobeError(f"--custom_api {entry!r}: cannot import {path!r} ({e})") from None
    return modules


class ApiResolver:
    """Dump name (prefix, api) -> callable, once per process (answers and refusals cached).

    Adapters implement `_find_builtin(prefix, api)`: the framework's own APIs, raising Unresolvable.
    """

    def __init__(self, custom_apis=()):
        self._custom = parse_custom_apis(custom_apis)
        self._cache = {}

    def resolve(self, prefix, api):
        key = (prefix, api)
        if key not in self._cache:
            try:
                self._cache[key] = self._find(prefix, api)
            except Unresolvable as e:
                self._cache[key] = e
        hit = self._cache[key]
        if isinstance(hit, Unresolvable):
            raise hit
        return hit

    def _find(self, prefix, api):
        if prefix in COMMUNICATION_PREFIXES:
            raise Unresolvable(f"{prefix}.{api} is a communication op: it needs the process group of the "
                               "run and is not checked offline")
        if prefix in self._custom:
            func = getattr(self._custom[prefix], api, None)
            if callable(func):
                return func
            raise Unresolvable(f"custom API {prefix}.{api}: module {self._custom[prefix].__name__} has no "
                               f"callable {api!r}")
        return self._find_builtin(prefix, api)

    def _find_builtin(self, prefix, api):
        raise NotImplementedError


def unknown_prefix(prefix, api):
    return Unresolvable(f"unknown API prefix {prefix!r} ({prefix}.{api}); for a custom API pass "
                        f"--custom_api {prefix}=<python module that defines {api}>")

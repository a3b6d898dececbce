"""What both frameworks' API resolvers share: the 'cannot run here' signal and `--custom_api` entries."""

import importlib

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

"""What both frameworks' API resolvers share: the 'cannot run here' signal, `--custom_api` entries, and
the resolution order (communication ops skipped, custom modules given with `--custom_api`, custom APIs
the dump's `api_sources.json` says where to find, then the framework's own names)."""

import importlib

from msprobe.core.acc_check.api_policy import RefusedApi, check_callable, check_recorded_module
from msprobe.core.acc_check.input_spec import COMMUNICATION_PREFIXES
from msprobe.core.dump.api_sources import read_api_sources
from msprobe.core.errors import MsprobeError
from msprobe.core.naming import OPTIMIZER_PREFIX


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

    Adapters implement `_find_builtin(prefix, api)`: the framework's own operators, raising Unresolvable
    (or api_policy.RefusedApi for a name that is not an operator), and `is_operator(func)`.

    Args:
        custom_apis: `--custom_api` entries ('Prefix=python.module'); they win over the dump's record.
        api_sources: path of the dump's api_sources.json, or None.
    """

    def __init__(self, custom_apis=(), api_sources=None):
        self._custom = parse_custom_apis(custom_apis)
        self.sources = read_api_sources(api_sources)
        self._cache = {}

    def resolve_case(self, case):
        """The callable that runs one ApiCase (an adapter whose calls of one name can differ, such as
        MindSpore's Primitive instances, overrides this)."""
        return self.resolve(case.prefix, case.api)

    def resolve(self, prefix, api):
        key = (prefix, api)
        if key not in self._cache:
            try:
                self._cache[key] = self._find(prefix, api)
            except Unresolvable as e:
                self._cache[key] = e
            except RefusedApi as e:
                self._cache[key] = Unresolvable(str(e))
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
        recorded = self.sources["custom_apis"].get(f"{prefix}.{api}")
        if recorded is not None:
            func = recorded_custom_api(prefix, api, recorded)
            check_callable(f"{prefix}.{api}", func, self.is_operator)
            return func
        return self._find_builtin(prefix, api)

    def _find_builtin(self, prefix, api):
        raise NotImplementedError

    def is_operator(self, func):
        """Whether `func` is one of the framework's operators (what a file may make acc_check run)."""
        raise NotImplementedError


def recorded_custom_api(prefix, api, where):
    """The callable api_sources.json says `register_custom_api` wrapped: its module (imported here, as
    `--custom_api` would), the class for `qualname`, then the attribute."""
    module = where.get("module") if isinstance(where, dict) else None
    hint = f"pass --custom_api {prefix}=<python module that defines {api}>"
    if not module:
        raise Unresolvable(f"custom API {prefix}.{api} was registered on an object, not a module or class: "
                           f"acc_check cannot find it again; {hint}")
    if module == "__main__":
        raise Unresolvable(f"custom API {prefix}.{api} was defined in the dumped run's main script, which "
                           f"acc_check does not run; {hint}")
    if not isinstance(module, str):
        raise Unresolvable(f"custom API {prefix}.{api}: api_sources.json gives module {module!r}, not a name")
    check_recorded_module(f"{prefix}.{api}", module)
    try:
        owner = importlib.import_module(module)
    except Exception as e:  # ImportError, or the module's own code failing: either way a SKIP reason
        raise Unresolvable(f"custom API {prefix}.{api}: cannot import {module!r}, recorded in "
                           f"api_sources.json ({type(e).__name__}: {e}); {hint}") from None
    qualname, attribute = where.get("qualname", ""), where.get("attribute", api)
    if not isinstance(qualname, str) or not isinstance(attribute, str) or \
            any(part.startswith("__") for part in qualname.split(".") + [attribute]):
        raise Unresolvable(f"custom API {prefix}.{api}: api_sources.json gives qualname {qualname!r}, attribute "
                           f"{attribute!r}; expected names without dunders")
    for part in filter(None, qualname.split(".")):
        owner = getattr(owner, part, None)
    func = getattr(owner, attribute, None)
    if not callable(func):
        place = module + (f".{where['qualname']}" if where.get("qualname") else "")
        raise Unresolvable(f"custom API {prefix}.{api}: {place} has no callable {api!r} here; {hint}")
    return func


def unknown_prefix(prefix, api):
    if prefix == OPTIMIZER_PREFIX:
        return Unresolvable(f"{prefix}.{api} is an optimizer step's update of one parameter, not an API")
    return Unresolvable(f"unknown API prefix {prefix!r} ({prefix}.{api}); for a custom API pass "
                        f"--custom_api {prefix}=<python module that defines {api}>")

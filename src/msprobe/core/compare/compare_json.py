"""compare.json, the input file of `msprobe compare -i` and `msprobe graph -i`: read and checked here once.

    {"npu_path": "target dump", "bench_path": "golden dump", "stack_path": "stack.json",
     "is_print_compare_log": true, "engine": "pool" | "ray", "address": "host:port"}

`graph` reads the same file; it has no rank-pair engine, so engine and address are checked and unused there.
"""

import os
from dataclasses import dataclass

from msprobe.core.compare.engines import ENGINES
from msprobe.core.errors import ConfigError, MsprobeError

FIELDS = ("npu_path", "bench_path", "stack_path", "is_print_compare_log", "engine", "address")


@dataclass(frozen=True)
class CompareJson:
    """The fields of a compare.json; those it leaves out are None (is_print_compare_log: False)."""
    npu_path: str
    bench_path: str | None = None
    stack_path: str | None = None
    is_print_compare_log: bool = False
    engine: str | None = None
    address: str | None = None


def read_compare_json(path, golden_required=True):
    """compare.json as a CompareJson, every field checked.

    Args:
        path: the compare.json file.
        golden_required: bench_path must be given (compare); `graph` draws one graph without it.

    Raises:
        MsprobeError: the file is unreadable, not JSON or not an object; a ConfigError naming the file and
            field, the value and what is allowed for an unknown field or a bad value.

    Example:
        >>> cfg = read_compare_json("compare.json")                               # doctest: +SKIP
        >>> write_compare(cfg.npu_path, cfg.bench_path, "out", stack_path=cfg.stack_path)  # doctest: +SKIP
    """
    from msprobe.core.file_limits import load_json

    doc = load_json(path)
    if not isinstance(doc, dict):
        raise MsprobeError(f"{path}: expected a JSON object with " + ", ".join(FIELDS))
    unknown = sorted(set(doc) - set(FIELDS))
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}", doc[unknown[0]], "the fields " + ", ".join(FIELDS))
    if doc.get("stack_path") == "":  # msProbe's files leave it empty for "none"
        del doc["stack_path"]
    for field in ("npu_path", "bench_path", "stack_path"):
        value = doc.get(field)
        if value is None and (field == "stack_path" or (field == "bench_path" and not golden_required)):
            continue
        if not isinstance(value, str) or not value or not os.path.exists(value):
            raise ConfigError(f"{path}: {field}", value, "an existing dump.json, stack.json or dump directory")
    if not isinstance(doc.get("is_print_compare_log", False), bool):
        raise ConfigError(f"{path}: is_print_compare_log", doc["is_print_compare_log"], "true, false")
    if "engine" in doc and doc["engine"] not in ENGINES:
        raise ConfigError(f"{path}: engine", doc["engine"], ", ".join(ENGINES))
    if "address" in doc and (not isinstance(doc["address"], str) or not doc["address"]):
        raise ConfigError(f"{path}: address", doc["address"], "a Ray cluster address (host:port)")
    return CompareJson(**{field: doc[field] for field in FIELDS if field in doc})

"""Dump configuration: parse config.json, apply constructor overrides, validate every field.

Owns the single validated `DumpConfig` both adapters read. Must not import torch or mindspore.
Every error names the field, the value and what is allowed (`ConfigError`).
"""

import builtins
import difflib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import List, Tuple

from msprobe.core.errors import ConfigError

logger = logging.getLogger(__name__)

TASKS = ("statistics", "tensor", "structure", "overflow_check")
LEVELS = ("L0", "L1", "mix", "debug", "L2")
DATA_MODES = ("all", "forward", "backward", "input", "output")
SUMMARY_MODES = ("statistics", "md5", "xor")

COMMON_FIELDS = ("task", "dump_path", "rank", "step", "level", "async_dump", "seed", "is_deterministic",
                 "enable_dataloader", "extra_info", "precision", "dump_enable", "framework")
TASK_FIELDS = ("scope", "list", "data_mode", "summary_mode", "tensor_list", "overflow_nums", "file_format")
# Fields msProbe configs carry that we accept for compatibility but that change nothing here.
ACCEPTED_NO_EFFECT = ("seed", "is_deterministic", "enable_dataloader", "acl_config", "risk_level",
                      "custom_op_namespaces", "bench_path", "diff_nums", "slice", "request_id", "device",
                      "check_mode", "file_format", "dump_enable", "framework")
KNOWN_BLOCKS = TASKS + ("acc_check", "run_ut", "free_benchmark", "grad_probe", "exception_dump", "nan_check")


@dataclass
class DumpConfig:
    """Validated dump settings. Build it with `load_config`, not by hand.

    Attributes mirror config.json: the common fields plus the block of the chosen task.
    """

    task: str = "statistics"
    dump_path: str = "./dump_path"
    rank: List[int] = field(default_factory=builtins.list)
    step: List[int] = field(default_factory=builtins.list)
    level: str = "L1"
    async_dump: bool = False
    extra_info: bool = True
    precision: str = "low"
    scope: List[str] = field(default_factory=builtins.list)
    list: List[str] = field(default_factory=builtins.list)
    data_mode: Tuple[str, ...] = ("all",)
    summary_mode: str = "statistics"
    tensor_list: List[str] = field(default_factory=builtins.list)
    overflow_nums: int = 1

    @property
    def saves_tensors(self):
        return self.task == "tensor"

    @property
    def wants_stats(self):
        return self.task != "structure"


def _fail(name, value, allowed):
    raise ConfigError(name, value, allowed)


def parse_index_list(name, value):
    """Parse a `rank`/`step` value: a list of ints and "a-b" ranges, a digit string, or a range string.

    >>> parse_index_list("step", [0, "2-4"])
    [0, 2, 3, 4]
    """
    allowed = 'a list of non-negative integers and "a-b" ranges, a digit string "n", or a range "a-b"'
    items = value if isinstance(value, list) else [value]
    out = []
    for item in items:
        if isinstance(item, bool):
            _fail(name, value, allowed)
        if isinstance(item, int):
            if item < 0:
                _fail(name, value, allowed)
            out.append(item)
        elif isinstance(item, str):
            text = item.strip()
            if text.isdigit():
                out.append(int(text))
            elif text.count("-") == 1 and all(p.strip().isdigit() for p in text.split("-")):
                lo, hi = (int(p) for p in text.split("-"))
                if lo > hi:
                    _fail(name, value, allowed + f" (range {text!r} runs backwards)")
                out.extend(range(lo, hi + 1))
            else:
                _fail(name, value, allowed)
        else:
            _fail(name, value, allowed)
    return sorted(set(out))


def _choice(name, value, allowed):
    if value not in allowed:
        _fail(name, value, " | ".join(allowed))
    return value


def _bool(name, value):
    if not isinstance(value, bool):
        _fail(name, value, "true | false")
    return value


def _str_list(name, value):
    """A list of non-empty strings; one string stands for a list of it (as one integer does for
    `rank`/`step`)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v for v in items):
        _fail(name, value, "a non-empty string or a list of them")
    return list(items)


def _unknown(name, value, known):
    close = difflib.get_close_matches(name.rsplit(".", 1)[-1], known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise ConfigError(name, value, "a known field: " + ", ".join(known) + hint)


def _validate_block(cfg, task, block):
    if not isinstance(block, dict):
        _fail(task, block, "an object with scope, list, data_mode, summary_mode, tensor_list")
    for key, value in block.items():
        name = f"{task}.{key}"
        if key == "scope":
            scope = _str_list(name, value)
            if len(scope) not in (0, 2):
                _fail(name, value, "[] or exactly two names [start, end]")
            cfg.scope = scope
        elif key == "list":
            cfg.list = _str_list(name, value)
        elif key == "tensor_list":
            cfg.tensor_list = _str_list(name, value)
        elif key == "data_mode":
            modes = _str_list(name, value)
            for m in modes:
                _choice(name, m, DATA_MODES)
            if not modes or len(modes) > 4 or ("all" in modes and len(modes) > 1):
                _fail(name, value, '["all"] or any of "forward", "backward", "input", "output"')
            cfg.data_mode = tuple(modes)
        elif key == "summary_mode":
            cfg.summary_mode = _choice(name, value, SUMMARY_MODES)
            if cfg.summary_mode == "xor":
                # msProbe's xor needs its compiled xor_checksum module; we record statistics instead.
                logger.warning("config field '%s': 'xor' is not supported here; statistics are recorded "
                               "instead", name)
                cfg.summary_mode = "statistics"
        elif key == "overflow_nums":
            if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
                _fail(name, value, "a positive integer, or -1 for no limit")
            cfg.overflow_nums = value
        elif key in ACCEPTED_NO_EFFECT:
            logger.warning("config field '%s' is accepted for compatibility and has no effect here", name)
        else:
            _unknown(name, value, TASK_FIELDS)


def config_from_dict(raw, *, source="config"):
    """Validate a config mapping (the content of config.json) into a `DumpConfig`.

    Raises:
        ConfigError: naming the first bad field.
    """
    if not isinstance(raw, dict):
        raise ConfigError(source, raw, "a JSON object")
    cfg = DumpConfig()
    for key, value in raw.items():
        if key == "task":
            cfg.task = _choice("task", value, TASKS)
        elif key == "dump_path":
            if not isinstance(value, str) or not value.strip():
                _fail("dump_path", value, "a non-empty path string")
            cfg.dump_path = value
        elif key in ("rank", "step"):
            setattr(cfg, key, parse_index_list(key, value))
        elif key == "level":
            cfg.level = _choice("level", value, LEVELS)
        elif key in ("async_dump", "extra_info"):
            setattr(cfg, key, _bool(key, value))
        elif key == "precision":
            cfg.precision = _choice("precision", value, ("low", "high"))
        elif key in KNOWN_BLOCKS:
            continue  # validated below, once the task is known
        elif key in ACCEPTED_NO_EFFECT:
            logger.warning("config field '%s' is accepted for compatibility and has no effect here", key)
        else:
            _unknown(key, value, COMMON_FIELDS + TASKS)
    if cfg.task in raw:
        _validate_block(cfg, cfg.task, raw[cfg.task])
    _check_combinations(cfg)
    return cfg


def _check_combinations(cfg):
    if cfg.async_dump and cfg.task == "tensor" and not cfg.list:
        _fail("tensor.list", cfg.list, "a non-empty list when async_dump is true and task is tensor")
    if cfg.async_dump and cfg.summary_mode == "md5":
        _fail("async_dump", True, "false when summary_mode is md5")


def read_config_file(config_path):
    """The JSON object of a config.json, or a ConfigError naming the file and what is wrong with it."""
    if not isinstance(config_path, (str, os.PathLike)) or not os.path.isfile(config_path):
        raise ConfigError("config_path", config_path, "an existing config.json file")
    try:
        with open(config_path, encoding="utf-8") as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError("config_path", str(config_path), f"valid JSON ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError as e:
        raise ConfigError("config_path", str(config_path), f"a UTF-8 JSON file ({e.reason})") from None
    if not isinstance(raw, dict):
        raise ConfigError(str(config_path), raw, "a JSON object")
    return raw


def config_task(config_path=None, task=None):
    """The task a PrecisionDebugger(config_path, task=...) is asked for: the argument wins over the file."""
    if task is not None:
        return task
    return read_config_file(config_path).get("task", "statistics") if config_path is not None else "statistics"


def load_config(config_path=None, *, task=None, dump_path=None, level=None, step=None):
    """Read config.json (optional) and apply constructor overrides, which win over the file.

    Args:
        config_path: path of config.json; None uses the defaults (statistics, L1, ./dump_path).
        task, dump_path, level, step: overrides, validated like the file's fields.

    Returns:
        DumpConfig

    Raises:
        ConfigError: the file is missing or not JSON, or a field is not allowed.
    """
    raw = read_config_file(config_path) if config_path is not None else {}
    raw = dict(raw)
    for name, value in (("task", task), ("dump_path", dump_path), ("level", level), ("step", step)):
        if value is not None:
            raw[name] = value
    return config_from_dict(raw, source=config_path or "config")

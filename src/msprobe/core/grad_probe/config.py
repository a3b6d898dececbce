"""grad_probe configuration: the common fields of config.json plus its `grad_probe` block.

    {"task": "grad_probe", "dump_path": "./grad_output", "rank": [], "step": [],
     "grad_probe": {"grad_level": "L1", "param_list": [], "bounds": [-1, 0, 1]}}

Must not import torch or mindspore. Every error names the field, the value and what is allowed.
"""

import difflib
import logging
import math
from dataclasses import dataclass, field
from typing import List

from msprobe.core.config import ACCEPTED_NO_EFFECT, KNOWN_BLOCKS, parse_index_list, read_config_file
from msprobe.core.errors import ConfigError

logger = logging.getLogger(__name__)

GRAD_LEVELS = ("L0", "L1", "L2")
BLOCK_FIELDS = ("grad_level", "param_list", "bounds")
COMMON_FIELDS = ("task", "dump_path", "rank", "step", "grad_probe")
# Common dump fields a shared config.json may carry; they do not concern gradient monitoring.
IGNORED_COMMON = ("level", "async_dump", "extra_info", "precision")


@dataclass
class GradProbeConfig:
    """Validated grad_probe settings; build with `load_grad_probe_config` or `grad_probe_config_from_dict`.

    Attributes:
        grad_level: L0 (statistics and a CRC-32 of the gradient), L1 (statistics and the sign bitmap,
            the default), L2 (L1 plus the share of elements in each interval of `bounds` and at 0).
        param_list: parameter names (or substrings) to monitor; empty: all.
        bounds: increasing interval boundaries for L2. Defaults to [-1, 0, 1].
        step: optimizer steps to record (counted from 0); empty: all. rank: likewise.
    """

    dump_path: str = "./grad_output"
    rank: List[int] = field(default_factory=list)
    step: List[int] = field(default_factory=list)
    grad_level: str = "L1"
    param_list: List[str] = field(default_factory=list)
    bounds: List[float] = field(default_factory=lambda: [-1, 0, 1])

    def wants_param(self, name):
        return not self.param_list or any(p == name or p in name for p in self.param_list)

    def wants_step(self, step):
        return not self.step or step in self.step

    def wants_rank(self, rank):
        return not self.rank or rank in self.rank

    @property
    def with_direction(self):
        return self.grad_level in ("L1", "L2")


def _unknown(name, value, known):
    close = difflib.get_close_matches(name.rsplit(".", 1)[-1], known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise ConfigError(name, value, "a known field: " + ", ".join(known) + hint)


def _bounds(value):
    allowed = "a non-empty list of finite numbers in strictly increasing order, e.g. [-1, 0, 1]"
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
            or any(b <= a for a, b in zip(value, value[1:]))):
        raise ConfigError("grad_probe.bounds", value, allowed)
    return list(value)


def _validate_block(cfg, block):
    if not isinstance(block, dict):
        raise ConfigError("grad_probe", block, "an object with grad_level, param_list, bounds")
    for key, value in block.items():
        name = f"grad_probe.{key}"
        if key == "grad_level":
            if value not in GRAD_LEVELS:
                raise ConfigError(name, value, " | ".join(GRAD_LEVELS))
            cfg.grad_level = value
        elif key == "param_list":
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise ConfigError(name, value, "a list of non-empty parameter names (empty: all parameters)")
            cfg.param_list = list(value)
        elif key == "bounds":
            cfg.bounds = _bounds(value)
        else:
            _unknown(name, value, BLOCK_FIELDS)


def grad_probe_config_from_dict(raw, *, source="config"):
    """Validate the content of a config.json whose task is grad_probe.

    Raises:
        ConfigError: naming the first bad field.
    """
    if not isinstance(raw, dict):
        raise ConfigError(source, raw, "a JSON object")
    if raw.get("task") != "grad_probe":
        raise ConfigError("task", raw.get("task"), "grad_probe (gradient monitoring reads only that task)")
    cfg = GradProbeConfig()
    for key, value in raw.items():
        if key == "dump_path":
            if not isinstance(value, str) or not value.strip():
                raise ConfigError("dump_path", value, "a non-empty path string")
            cfg.dump_path = value
        elif key in ("rank", "step"):
            setattr(cfg, key, parse_index_list(key, value))
        elif key == "grad_probe":
            _validate_block(cfg, value)
        elif key == "task" or key in KNOWN_BLOCKS:
            continue  # other tasks' blocks in a shared config.json
        elif key in IGNORED_COMMON or key in ACCEPTED_NO_EFFECT:
            logger.warning("config field '%s' has no effect on task grad_probe", key)
        else:
            _unknown(key, value, COMMON_FIELDS)
    return cfg


def load_grad_probe_config(config_path):
    """Read and validate a grad_probe config.json.

    Raises:
        ConfigError: the file is missing or not JSON, or a field is not allowed.
    """
    raw = read_config_file(config_path)
    return grad_probe_config_from_dict(raw, source=str(config_path))


def grad_probe_config_for_debugger(config_path=None, *, dump_path=None, step=None):
    """The GradProbeConfig of `PrecisionDebugger(config_path, task="grad_probe", dump_path=, step=)`:
    the file (if any) with the constructor's overrides, which win."""
    raw = dict(read_config_file(config_path)) if config_path is not None else {}
    raw["task"] = "grad_probe"
    for name, value in (("dump_path", dump_path), ("step", step)):
        if value is not None:
            raw[name] = value
    return grad_probe_config_from_dict(raw, source=str(config_path or "config"))

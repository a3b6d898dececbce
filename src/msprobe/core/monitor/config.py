"""Monitor config.json (msProbe's TrainerMon fields): parse and validate into `MonitorConfig`.

Every bad value raises `ConfigError` naming the field, the value and what is allowed; unknown fields
are refused with a "did you mean". Fields msProbe has that do nothing here are accepted with a warning
when they are switched on. Must not import torch or mindspore.
"""

import difflib
import json
import logging
import numbers
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from msprobe.core.config import parse_index_list
from msprobe.core.errors import ConfigError
from msprobe.core.monitor.alert_thresholds import RULE_DEFAULT_THRESHOLD
from msprobe.core.monitor.ops import DEFAULT_OPS, OPS

logger = logging.getLogger(__name__)

FORMATS = ("csv", "tensorboard", "api")
RULES = ("AnomalyTurbulence", "AnomalyNan")
BOOL_FIELDS = ("print_struct", "xy_distribution", "all_xy", "forward_only", "backward_only", "wg_distribution",
               "mv_distribution", "param_distribution")
# msProbe fields accepted for compatibility; switching them on only logs a warning.
ACCEPTED_NO_EFFECT = ("monitor_mbs_grad", "ur_distribution", "mg_direction", "cc_distribution", "stack_info",
                      "recording_l2_features", "l2_targets", "sa_order", "append_output", "squash_name",
                      "dynamic_on")
KNOWN_FIELDS = ("targets", "module_ranks", "ops", "eps", "ndigits", "start_step", "step_interval",
                "collect_times", "format", "alert", "step_count_per_record") + BOOL_FIELDS + ACCEPTED_NO_EFFECT
_TUPLE_SPEC = re.compile(r"^tuple\[(\d+)\]:(\d+)$")
IO_KEYS = ("input", "output", "input_grad", "output_grad")


@dataclass
class AlertRule:
    """One alert rule of the config: its name and threshold."""

    name: str
    threshold: float


@dataclass
class MonitorConfig:
    """Validated monitor settings; build it with `load_monitor_config` or `monitor_config_from_dict`."""

    targets: Dict[str, Dict[str, Optional[int]]] = field(default_factory=dict)
    print_struct: bool = False
    module_ranks: List[int] = field(default_factory=list)
    xy_distribution: bool = False
    all_xy: bool = False
    forward_only: bool = False
    backward_only: bool = False
    wg_distribution: bool = False
    mv_distribution: bool = False
    param_distribution: bool = False
    ops: Tuple[str, ...] = DEFAULT_OPS
    eps: float = 1e-8
    ndigits: int = 6
    start_step: int = 0
    step_interval: int = 1
    collect_times: int = 100_000_000
    format: str = "csv"
    alert_rules: List[AlertRule] = field(default_factory=list)
    alert_dump: bool = False
    step_count_per_record: int = 1

    @property
    def monitors_activations(self):
        return self.xy_distribution or self.all_xy

    def collects(self, step, collected_so_far):
        """Whether `step` is recorded: at or after start_step, on the interval, within collect_times."""
        return (step >= self.start_step and (step - self.start_step) % self.step_interval == 0
                and collected_so_far < self.collect_times)

    def monitors_rank(self, rank):
        """module_ranks selects the ranks whose modules (activations) are monitored; empty = all."""
        return not self.module_ranks or rank in self.module_ranks

    def target_of(self, name):
        """The targets entry covering module/parameter `name` (itself or an enclosing module), or None.

        With no targets every name is covered (an empty spec).
        """
        if not self.targets:
            return {}
        for key, spec in self.targets.items():
            if name == key or name.startswith(key + ".") or key == "":
                return spec
        return None


def _fail(name, value, allowed):
    raise ConfigError(name, value, allowed)


def _int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _fail(name, value, f"an integer >= {minimum}")
    return value


def _number(name, value, positive=True):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or (positive and not value > 0):
        _fail(name, value, "a positive number" if positive else "a number")
    return float(value)


def _io_spec(name, value):
    """'tensor' -> None (the whole value), 'tuple[n]:i' -> i (element i of an n-tuple)."""
    allowed = '"tensor" or "tuple[n]:i" (element i of an n-element tuple)'
    if value == "tensor":
        return None
    m = _TUPLE_SPEC.match(value) if isinstance(value, str) else None
    if not m or int(m.group(2)) >= int(m.group(1)):
        _fail(name, value, allowed)
    return int(m.group(2))


def _targets(value):
    if not isinstance(value, dict):
        _fail("targets", value, "an object {module_name: {input|output|input_grad|output_grad: spec}}")
    out = {}
    for module, spec in value.items():
        name = f"targets.{module}"
        if spec in (None, {}):
            out[module] = {}
            continue
        if not isinstance(spec, dict):
            _fail(name, spec, "an object with input, output, input_grad, output_grad")
        parsed = {}
        for key, io in spec.items():
            if key not in IO_KEYS:
                _fail(f"{name}.{key}", io, " | ".join(IO_KEYS))
            parsed[key] = _io_spec(f"{name}.{key}", io)
        out[module] = parsed
    return out


def _ops(value):
    if not isinstance(value, list) or not value:
        _fail("ops", value, "a non-empty list of " + " | ".join(OPS))
    for op in value:
        if op not in OPS:
            close = difflib.get_close_matches(str(op), OPS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            _fail("ops", op, " | ".join(OPS) + hint)
    return tuple(dict.fromkeys(value))  # keep the user's order, drop repeats


def _alert(cfg, value):
    if not isinstance(value, dict):
        _fail("alert", value, 'an object {"rules": [...], "dump": true|false}')
    for key, item in value.items():
        if key == "dump":
            if not isinstance(item, bool):
                _fail("alert.dump", item, "true | false")
            cfg.alert_dump = item
        elif key == "rules":
            if not isinstance(item, list):
                _fail("alert.rules", item, 'a list of {"rule_name": ..., "args": {"threshold": ...}}')
            for i, rule in enumerate(item):
                where = f"alert.rules[{i}]"
                if not isinstance(rule, dict):
                    _fail(where, rule, 'an object {"rule_name": ..., "args": {"threshold": ...}}')
                rule_name = rule.get("rule_name")
                if rule_name not in RULES:
                    _fail(f"{where}.rule_name", rule_name, " | ".join(RULES))
                args = rule.get("args", {})
                if not isinstance(args, dict) or set(args) - {"threshold"}:
                    _fail(f"{where}.args", args, '{"threshold": <positive number>}')
                threshold = _number(f"{where}.args.threshold",
                                    args.get("threshold", RULE_DEFAULT_THRESHOLD[rule_name]))
                extra = set(rule) - {"rule_name", "args"}
                if extra:
                    _fail(f"{where}.{sorted(extra)[0]}", rule[sorted(extra)[0]], "rule_name, args")
                cfg.alert_rules.append(AlertRule(rule_name, threshold))
        else:
            _fail(f"alert.{key}", item, "rules, dump")


def monitor_config_from_dict(raw, *, source="monitor config"):
    """Validate the content of a monitor config.json.

    Raises:
        ConfigError: naming the first bad field.
    """
    if not isinstance(raw, dict):
        raise ConfigError(source, raw, "a JSON object")
    cfg = MonitorConfig()
    for key, value in raw.items():
        if key == "targets":
            cfg.targets = _targets(value)
        elif key in BOOL_FIELDS:
            if not isinstance(value, bool):
                _fail(key, value, "true | false")
            setattr(cfg, key, value)
        elif key == "module_ranks":
            cfg.module_ranks = parse_index_list("module_ranks", value) if value != [] else []
        elif key == "ops":
            cfg.ops = _ops(value)
        elif key == "eps":
            cfg.eps = _number("eps", value)
        elif key == "ndigits":
            cfg.ndigits = _int("ndigits", value, 0)
        elif key == "start_step":
            cfg.start_step = _int("start_step", value, 0)
        elif key in ("step_interval", "collect_times", "step_count_per_record"):
            setattr(cfg, key, _int(key, value, 1))
        elif key == "format":
            if value not in FORMATS:
                _fail("format", value, " | ".join(FORMATS))
            cfg.format = value
        elif key == "alert":
            _alert(cfg, value)
        elif key in ACCEPTED_NO_EFFECT:
            if value not in (False, None, [], {}, "") and not (isinstance(value, dict) and not value.get("enable")):
                logger.warning("monitor config field '%s' is accepted for compatibility and has no effect here",
                               key)
        else:
            close = difflib.get_close_matches(key, KNOWN_FIELDS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            _fail(key, value, "a known monitor field: " + ", ".join(KNOWN_FIELDS) + hint)
    if cfg.forward_only and cfg.backward_only:
        _fail("backward_only", True, "false when forward_only is true (they exclude each other)")
    return cfg


def load_monitor_config(config_file_path):
    """Read and validate a monitor config.json.

    Raises:
        ConfigError: the file is missing or not JSON, or a field is not allowed.
    """
    if not isinstance(config_file_path, (str, os.PathLike)) or not os.path.isfile(config_file_path):
        raise ConfigError("config_file_path", config_file_path, "an existing monitor config.json file")
    try:
        with open(config_file_path, encoding="utf-8") as f:
            raw = json.load(f)
    except json.JSONDecodeError as e:
        raise ConfigError("config_file_path", str(config_file_path),
                          f"valid JSON ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError as e:
        raise ConfigError("config_file_path", str(config_file_path), f"a UTF-8 JSON file ({e.reason})") from None
    return monitor_config_from_dict(raw, source=str(config_file_path))

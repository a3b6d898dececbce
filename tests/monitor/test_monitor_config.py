"""Monitor config.json validation: every bad field is refused with its name, the value and what is
allowed; good configs parse into the right MonitorConfig; step selection follows start_step,
step_interval and collect_times."""

from pathlib import Path

import pytest

from msprobe.core.errors import ConfigError
from msprobe.core.monitor.config import load_monitor_config, monitor_config_from_dict

SAMPLES = str(Path(__file__).resolve().parents[1] / "data" / "msprobe-samples/monitor")


@pytest.mark.parametrize("raw, field, fragment", [
    ({"ops": ["norm", "l2"]}, "ops", "norm | min | max"),
    ({"ops": ["nrom"]}, "ops", "did you mean 'norm'"),
    ({"ops": []}, "ops", "non-empty list"),
    ({"format": "parquet"}, "format", "csv | tensorboard | api"),
    ({"eps": 0}, "eps", "positive number"),
    ({"eps": "1e-8"}, "eps", "positive number"),
    ({"start_step": -1}, "start_step", "integer >= 0"),
    ({"step_interval": 0}, "step_interval", "integer >= 1"),
    ({"collect_times": 1.5}, "collect_times", "integer >= 1"),
    ({"xy_distribution": "yes"}, "xy_distribution", "true | false"),
    ({"wg_distribution": 1}, "wg_distribution", "true | false"),
    ({"module_ranks": ["x"]}, "module_ranks", "non-negative integers"),
    ({"targets": []}, "targets", "an object"),
    ({"targets": {"fc1": {"input": "tuple[2]:5"}}}, "targets.fc1.input", "tuple[n]:i"),
    ({"targets": {"fc1": {"inputs": "tensor"}}}, "targets.fc1.inputs", "input | output"),
    ({"alert": {"rules": [{"rule_name": "AnomalyWeird"}]}}, "alert.rules[0].rule_name", "AnomalyTurbulence | AnomalyNan"),
    ({"alert": {"rules": [{"rule_name": "AnomalyTurbulence", "args": {"threshold": -1}}]}},
     "alert.rules[0].args.threshold", "positive number"),
    ({"alert": {"rules": [{"rule_name": "AnomalyNan", "args": {"limit": 3}}]}}, "alert.rules[0].args", "threshold"),
    ({"alert": {"dump": "yes"}}, "alert.dump", "true | false"),
    ({"alert": {"rule": []}}, "alert.rule", "rules, dump"),
    ({"wg_distributon": True}, "wg_distributon", "did you mean 'wg_distribution'"),
    ({"forward_only": True, "backward_only": True}, "backward_only", "exclude each other"),
])
def test_bad_field_is_named(raw, field, fragment):
    with pytest.raises(ConfigError) as e:
        monitor_config_from_dict(raw)
    assert e.value.field == field
    msg = str(e.value)
    assert msg.startswith(f"config field '{field}': got ") and fragment in msg, msg
    assert "\n" not in msg


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="config_file_path.*existing monitor config.json"):
        load_monitor_config(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"ops": ["norm",]}')
    with pytest.raises(ConfigError, match=r"valid JSON \(.* at line 1\)"):
        load_monitor_config(str(bad))
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="a JSON object"):
        load_monitor_config(str(arr))


def test_msprobe_sample_configs_parse():
    full = load_monitor_config(f"{SAMPLES}/monitor_config_full.json")
    assert full.xy_distribution and full.wg_distribution and full.mv_distribution and full.param_distribution
    assert full.ops == ("norm", "min", "max", "mean", "nans", "zeros")
    assert [(r.name, r.threshold) for r in full.alert_rules] == [("AnomalyTurbulence", 0.5)]
    assert full.alert_dump and full.format == "csv" and full.targets == {}
    light = load_monitor_config(f"{SAMPLES}/monitor_config_light.json")
    assert light.wg_distribution and not light.xy_distribution and light.ops == ("norm",)


def test_defaults_and_values(tmp_path):
    cfg = monitor_config_from_dict({})
    assert cfg.ops == ("norm",) and cfg.eps == 1e-8 and cfg.format == "csv" and cfg.alert_rules == []
    cfg = monitor_config_from_dict({
        "targets": {"blocks.0": {"input": "tuple[2]:1", "output": "tensor"}, "head": {}},
        "module_ranks": [1, "3-4"], "ops": ["max", "norm", "max"], "eps": 1e-6,
        "alert": {"rules": [{"rule_name": "AnomalyNan"}]}, "mg_direction": False})
    assert cfg.targets == {"blocks.0": {"input": 1, "output": None}, "head": {}}
    assert cfg.module_ranks == [1, 3, 4] and cfg.monitors_rank(3) and not cfg.monitors_rank(0)
    assert cfg.ops == ("max", "norm")  # user order, repeats dropped
    assert cfg.alert_rules[0].threshold == 1e10
    assert cfg.target_of("blocks.0.fc1") == {"input": 1, "output": None}
    assert cfg.target_of("blocks.01") is None and cfg.target_of("head") == {}


def test_compat_fields_warn_when_switched_on(caplog):
    monitor_config_from_dict({"mg_direction": False, "cc_distribution": {"enable": False}})
    assert not caplog.records
    monitor_config_from_dict({"ur_distribution": True})
    assert "ur_distribution" in caplog.text and "no effect" in caplog.text


def test_step_selection():
    cfg = monitor_config_from_dict({"start_step": 2, "step_interval": 3, "collect_times": 2})
    picked, collected = [], 0
    for step in range(20):
        if cfg.collects(step, collected):
            picked.append(step)
            collected += 1
    assert picked == [2, 5]

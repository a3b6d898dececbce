"""msprobe.core.config: defaults, overrides, rank/step grammar, and one error per bad field.

Every ConfigError must name the field, the value given and what is allowed (msprobe-facts §2).
"""

from pathlib import Path
import glob
import json
import logging
import os

import pytest

from msprobe.core.config import DumpConfig, config_from_dict, load_config, parse_index_list
from msprobe.core.errors import ConfigError, MsprobeError

SAMPLES = str(Path(__file__).resolve().parents[1] / "data" / "msprobe-samples")


def write_config(tmp_path, content, name="config.json"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=2), encoding="utf-8")
    return str(path)


def config_error(raw):
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw)
    return info.value, str(info.value)


# -- defaults and overrides --------------------------------------------------------------------------
def test_defaults_without_file():
    cfg = load_config()
    assert isinstance(cfg, DumpConfig)
    assert (cfg.task, cfg.level, cfg.dump_path) == ("statistics", "L1", "./dump_path")
    assert cfg.rank == [] and cfg.step == []
    assert cfg.scope == [] and cfg.list == [] and cfg.tensor_list == []
    assert cfg.data_mode == ("all",)
    assert cfg.summary_mode == "statistics"
    assert cfg.async_dump is False and cfg.extra_info is True
    assert cfg.wants_stats and not cfg.saves_tensors


def test_empty_file_object_gives_defaults(tmp_path):
    cfg = load_config(write_config(tmp_path, {}))
    assert (cfg.task, cfg.level, cfg.dump_path) == ("statistics", "L1", "./dump_path")


def test_file_fields_are_read(tmp_path):
    path = write_config(tmp_path, {
        "task": "tensor", "dump_path": "/tmp/x", "rank": [0, 1], "step": [2], "level": "mix",
        "async_dump": False, "extra_info": False, "precision": "high",
        "tensor": {"scope": ["Module.a.A.forward.0", "Module.b.B.forward.0"], "list": ["relu"],
                   "data_mode": ["forward", "input"], "summary_mode": "md5"}})
    cfg = load_config(path)
    assert (cfg.task, cfg.dump_path, cfg.level) == ("tensor", "/tmp/x", "mix")
    assert cfg.rank == [0, 1] and cfg.step == [2]
    assert cfg.extra_info is False and cfg.precision == "high"
    assert cfg.scope == ["Module.a.A.forward.0", "Module.b.B.forward.0"]
    assert cfg.list == ["relu"]
    assert cfg.data_mode == ("forward", "input")
    assert cfg.summary_mode == "md5"
    assert cfg.saves_tensors


def test_constructor_overrides_win_over_file(tmp_path):
    path = write_config(tmp_path, {"task": "tensor", "dump_path": "/from/file", "level": "L0", "step": [5],
                                   "statistics": {"list": ["linear"]}})
    cfg = load_config(path, task="statistics", dump_path="/from/ctor", level="mix", step=[1, "3-4"])
    assert (cfg.task, cfg.dump_path, cfg.level) == ("statistics", "/from/ctor", "mix")
    assert cfg.step == [1, 3, 4]
    # the block of the overriding task is the one applied
    assert cfg.list == ["linear"]


def test_overrides_are_validated_like_file_fields(tmp_path):
    with pytest.raises(ConfigError, match="level"):
        load_config(write_config(tmp_path, {}), level="L9")
    with pytest.raises(ConfigError, match="task"):
        load_config(task="nonsense")
    with pytest.raises(ConfigError, match="step"):
        load_config(step=[-1])


def test_file_is_not_modified_by_overrides(tmp_path):
    path = write_config(tmp_path, {"task": "tensor"})
    before = open(path).read()
    load_config(path, task="statistics")
    assert open(path).read() == before


# -- rank / step grammar -------------------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [
    ([], []),
    ([0, 2, 1], [0, 1, 2]),
    ([3, 3], [3]),
    ("2", [2]),
    (" 7 ", [7]),
    (5, [5]),
    ("4-6", [4, 5, 6]),
    ("3-3", [3]),
    ([0, "2-4", 9], [0, 2, 3, 4, 9]),
    (["1", "5-6", 3], [1, 3, 5, 6]),
])
@pytest.mark.parametrize("field", ["rank", "step"])
def test_rank_and_step_grammar(field, value, expected):
    assert getattr(config_from_dict({field: value}), field) == expected
    assert parse_index_list(field, value) == expected


@pytest.mark.parametrize("value", [-1, [-1], [0, -2], "-1", "a", ["x"], [1.5], 1.5, True, [True], "1-2-3",
                                   {"a": 1}, [None], "4-", "-4"])
@pytest.mark.parametrize("field", ["rank", "step"])
def test_bad_rank_and_step(field, value):
    err, msg = config_error({field: value})
    assert err.field == field
    assert f"'{field}'" in msg and repr(value) in msg
    assert '"a-b"' in msg  # the allowed forms are spelled out


@pytest.mark.parametrize("field", ["rank", "step"])
def test_reversed_range(field):
    err, msg = config_error({field: [0, "6-4"]})
    assert err.field == field
    assert "'6-4'" in msg and "backwards" in msg
    assert repr([0, "6-4"]) in msg


# -- one error per bad value ---------------------------------------------------------------------------
@pytest.mark.parametrize("raw, field, value, allowed", [
    ({"task": "overflow"}, "task", "overflow", ["statistics", "tensor", "structure"]),
    ({"task": 3}, "task", 3, ["statistics", "tensor"]),
    ({"level": "L3"}, "level", "L3", ["L0", "L1", "mix", "debug"]),
    ({"level": "l1"}, "level", "l1", ["L0", "L1", "mix"]),
    ({"precision": "max"}, "precision", "max", ["low", "high"]),
    ({"dump_path": ""}, "dump_path", "", ["non-empty path"]),
    ({"dump_path": 3}, "dump_path", 3, ["non-empty path"]),
    ({"async_dump": "true"}, "async_dump", "true", ["true", "false"]),
    ({"async_dump": 1}, "async_dump", 1, ["true", "false"]),
    ({"extra_info": "false"}, "extra_info", "false", ["true", "false"]),
    ({"statistics": {"data_mode": ["fwd"]}}, "statistics.data_mode", "fwd",
     ["all", "forward", "backward", "input", "output"]),
    ({"statistics": {"data_mode": ["all", "forward"]}}, "statistics.data_mode", ["all", "forward"],
     ['["all"]', "forward", "backward", "input", "output"]),
    ({"statistics": {"data_mode": []}}, "statistics.data_mode", [], ['["all"]', "forward"]),
    ({"statistics": {"summary_mode": "sha1"}}, "statistics.summary_mode", "sha1", ["statistics", "md5"]),
    ({"task": "tensor", "tensor": {"summary_mode": 1}}, "tensor.summary_mode", 1, ["statistics", "md5"]),
    ({"statistics": {"scope": ["Module.a.A.forward.0"]}}, "statistics.scope", ["Module.a.A.forward.0"],
     ["exactly two names"]),
    ({"statistics": {"scope": ["a", "b", "c"]}}, "statistics.scope", ["a", "b", "c"], ["exactly two names"]),
    ({"statistics": {"scope": "a"}}, "statistics.scope", "a", ["exactly two names"]),
    ({"statistics": {"list": ["relu", ""]}}, "statistics.list", ["relu", ""], ["a non-empty string or a list of them"]),
    ({"statistics": {"list": [1]}}, "statistics.list", [1], ["a non-empty string or a list of them"]),
    ({"statistics": []}, "statistics", [], ["an object"]),
    ({"statistics": {"overflow_nums": 0}}, "statistics.overflow_nums", 0, ["positive integer", "-1"]),
])
def test_bad_values_name_field_value_and_allowed(raw, field, value, allowed):
    err, msg = config_error(raw)
    assert err.field == field
    assert err.value == value
    assert f"'{field}'" in msg
    assert repr(value) in msg
    for word in allowed:
        assert word in msg, (word, msg)


def test_task_block_of_unselected_task_is_not_validated():
    # msProbe configs carry blocks for several tasks; only the selected task's block applies
    cfg = config_from_dict({"task": "statistics", "tensor": {"data_mode": ["bogus"]},
                            "statistics": {"list": ["relu"]}})
    assert cfg.list == ["relu"]


def test_unknown_top_level_field_suggests_close_match():
    err, msg = config_error({"levl": "L1"})
    assert err.field == "levl"
    assert "'L1'" in msg
    assert "did you mean 'level'" in msg
    assert "task" in msg and "dump_path" in msg  # lists the known fields


def test_unknown_top_level_field_without_close_match():
    err, msg = config_error({"zzzzzz": 1})
    assert err.field == "zzzzzz" and "did you mean" not in msg
    assert "a known field" in msg


@pytest.mark.parametrize("bad, close", [("scop", "scope"), ("data_mod", "data_mode"),
                                        ("summary_mod", "summary_mode"), ("lst", "list")])
def test_unknown_task_block_field_suggests_close_match(bad, close):
    err, msg = config_error({"task": "statistics", "statistics": {bad: []}})
    assert err.field == f"statistics.{bad}"
    assert f"'statistics.{bad}'" in msg
    assert f"did you mean '{close}'" in msg


def test_msprobe_own_fields_accepted_with_warning(caplog):
    raw = {"task": "statistics", "enable_dataloader": False, "is_deterministic": False, "seed": 1234,
           "acl_config": "/x.json", "risk_level": "FOCUS", "dump_enable": True, "framework": "pytorch",
           "custom_op_namespaces": ["_C_ascend"],
           "statistics": {"bench_path": "/b", "diff_nums": 1, "slice": [], "device": "host"}}
    with caplog.at_level(logging.WARNING, logger="msprobe.core.config"):
        cfg = config_from_dict(raw)
    assert cfg.task == "statistics"
    text = caplog.text
    assert "enable_dataloader" in text and "is_deterministic" in text
    assert "statistics.bench_path" in text


def test_other_tool_blocks_are_accepted():
    cfg = config_from_dict({"task": "statistics", "acc_check": {"white_list": []}, "run_ut": {},
                            "free_benchmark": {}, "grad_probe": {}})
    assert cfg.task == "statistics"


def test_xor_summary_mode_is_accepted_as_statistics(caplog):
    with caplog.at_level(logging.WARNING, logger="msprobe.core.config"):
        cfg = config_from_dict({"statistics": {"summary_mode": "xor"}})
    assert cfg.summary_mode == "statistics"
    assert "xor" in caplog.text


def test_combination_async_tensor_needs_list():
    err, msg = config_error({"task": "tensor", "async_dump": True})
    assert err.field == "tensor.list" and "async_dump" in msg
    config_from_dict({"task": "tensor", "async_dump": True, "tensor": {"list": ["relu"]}})


def test_combination_async_md5():
    err, _ = config_error({"async_dump": True, "statistics": {"summary_mode": "md5"}})
    assert err.field == "async_dump"


def test_config_error_is_msprobe_error():
    assert issubclass(ConfigError, MsprobeError)


def test_not_an_object():
    err, msg = config_error([1, 2])
    assert "a JSON object" in msg


# -- the file itself -------------------------------------------------------------------------------
def test_missing_config_file(tmp_path):
    missing = str(tmp_path / "nope" / "config.json")
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    msg = str(info.value)
    assert info.value.field == "config_path"
    assert missing in msg and "existing config.json" in msg


def test_directory_as_config_file(tmp_path):
    with pytest.raises(ConfigError, match="existing config.json"):
        load_config(str(tmp_path))


def test_invalid_json_names_the_line(tmp_path):
    path = write_config(tmp_path, '{\n  "task": "statistics",\n  "level": "L1"\n  "step": []\n}\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert path in msg
    assert "line 4" in msg
    assert "valid JSON" in msg


def test_truncated_json(tmp_path):
    path = write_config(tmp_path, '{"task": "statistics", "level": ')
    with pytest.raises(ConfigError, match="line 1"):
        load_config(path)


def test_non_utf8_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"task": "\xff\xfe"}')
    with pytest.raises(ConfigError, match="config_path"):
        load_config(str(path))


@pytest.mark.parametrize("content", ["[]", "3", '"x"', "null"])
def test_top_level_not_an_object(tmp_path, content):
    path = write_config(tmp_path, content)
    with pytest.raises(ConfigError, match="a JSON object"):
        load_config(path)
    # with an override too (used to be a TypeError)
    with pytest.raises(ConfigError, match="a JSON object"):
        load_config(path, level="L1")


def test_msprobe_sample_configs_all_load():
    paths = sorted(glob.glob(os.path.join(SAMPLES, "*", "*", "config.json")))
    if not paths:
        pytest.skip(f"msProbe samples not found under {SAMPLES}")
    loaded = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        cfg = load_config(path)
        assert cfg.task == raw["task"] and cfg.level == raw["level"], path
        loaded[path] = cfg
    assert len(loaded) == len(paths) >= 10

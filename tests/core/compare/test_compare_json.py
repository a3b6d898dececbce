"""compare.json is read by one function for `compare -i`, `graph -i` and Python callers: the same fields,
the same one-line errors naming the file, field, value and what is allowed, whichever command reads it."""

import json
import subprocess
import sys

import pytest

from msprobe.core.compare.compare_json import CompareJson, read_compare_json
from msprobe.core.errors import ConfigError, MsprobeError


@pytest.fixture
def dumps(tmp_path):
    for side in ("t", "g"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "data": {}}))
    return str(tmp_path / "t"), str(tmp_path / "g")


def write(tmp_path, doc):
    path = tmp_path / "compare.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_every_field_read(tmp_path, dumps):
    t, g = dumps
    path = write(tmp_path, {"npu_path": t, "bench_path": g, "stack_path": t + "/dump.json",
                            "is_print_compare_log": True, "engine": "ray", "address": "head:6379"})
    assert read_compare_json(path) == CompareJson(t, g, t + "/dump.json", True, "ray", "head:6379")
    assert read_compare_json(write(tmp_path, {"npu_path": t}), golden_required=False) == CompareJson(t)
    assert read_compare_json(write(tmp_path, {"npu_path": t, "bench_path": g, "stack_path": ""})) == CompareJson(t, g)


@pytest.mark.parametrize("doc, field, allowed", [
    ({"npu_path": "T", "bench_path": "G", "npu_dir": "x"}, "npu_dir", "the fields npu_path, bench_path"),
    ({"npu_path": "T"}, "bench_path", "an existing dump.json"),
    ({"npu_path": "T", "bench_path": "/no/such/dump"}, "bench_path", "an existing dump.json"),
    ({"npu_path": 3, "bench_path": "G"}, "npu_path", "an existing dump.json"),
    ({"npu_path": "T", "bench_path": "G", "stack_path": 0}, "stack_path", "an existing"),
    ({"npu_path": "T", "bench_path": "G", "is_print_compare_log": "yes"}, "is_print_compare_log", "true, false"),
    ({"npu_path": "T", "bench_path": "G", "engine": "spark"}, "engine", "pool, ray"),
    ({"npu_path": "T", "bench_path": "G", "address": ""}, "address", "host:port"),
])
def test_a_bad_field_is_named_with_its_value(tmp_path, dumps, doc, field, allowed):
    doc = {k: {"T": dumps[0], "G": dumps[1]}.get(v, v) if isinstance(v, str) else v for k, v in doc.items()}
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError) as e:
        read_compare_json(path)
    assert e.value.field == f"{path}: {field}" and allowed in e.value.allowed
    assert "\n" not in str(e.value)


def test_not_an_object(tmp_path):
    with pytest.raises(MsprobeError, match="expected a JSON object with npu_path, bench_path"):
        read_compare_json(write(tmp_path, ["a", "b"]))


@pytest.mark.parametrize("command", (["compare"], ["graph"]))
def test_both_commands_say_the_same(tmp_path, dumps, command):
    """The same bad compare.json gives the same stderr line (after the command name) from both commands."""
    path = write(tmp_path, {"npu_path": dumps[0], "bench_path": dumps[1], "is_print_compare_log": 1})
    run = subprocess.run([sys.executable, "-m", "msprobe.cli.main", *command, "-i", path, "-o", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stderr == (f"msprobe {command[0]}: config field '{path}: is_print_compare_log': got 1; "
                          "allowed: true, false\n")

"""DumpReader and find_rank_dirs on our own dumps (written with DumpWriter) and on msProbe's samples.

msProbe samples: /work/shared/reference/msprobe-samples/{pt_dump,ms_dump}/*/ (dump.json or debug.json,
stack.json, construct.json). Tests on them are skipped when the samples are absent.
"""

from pathlib import Path
import glob
import json
import math
import os
import shutil

import pytest

from msprobe.core.dump.reader import DumpReader, RankDir, find_rank_dirs, iter_tensor_records, stat_value
from msprobe.core.dump.writer import DumpWriter
from msprobe.core.errors import DumpFormatError, MsprobeError

SAMPLES = str(Path(__file__).resolve().parents[2] / "data" / "msprobe-samples")
SAMPLE_DIRS = sorted(glob.glob(os.path.join(SAMPLES, "pt_dump", "*", ""))
                     + glob.glob(os.path.join(SAMPLES, "ms_dump", "*", "")))
OVERFLOW_DUMP = os.path.join(SAMPLES, "overflow", "ovf_statistics_L1_dump.json")

needs_samples = pytest.mark.skipif(not SAMPLE_DIRS, reason=f"msProbe samples not found under {SAMPLES}")


def tensor(mx, shape=(2,)):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(shape), "Max": mx, "Min": 0.0,
            "Mean": 0.5, "Norm": 1.0, "requires_grad": True}


KEYS = ["Functional.linear.0.forward", "Module.fc1.Linear.forward.0", "Functional.relu.0.forward",
        "Functional.linear.1.forward", "Module.fc2.Linear.forward.0", "Tensor.sum.0.forward",
        "Tensor.sum.0.backward", "Functional.linear.1.backward", "Module.fc2.Linear.parameters_grad.0"]


def write_dump(rank_dir, keys=KEYS, level="mix", debug=False):
    w = DumpWriter(str(rank_dir), task="statistics", level=level, framework="pytorch", debug=debug)
    here = os.path.abspath(__file__)
    for i, key in enumerate(keys):
        if key.endswith("backward"):
            rec = {"input": [tensor(float(i))], "output": [tensor(float(i)), None]}
        elif "parameters_grad" in key:
            rec = {"weight": [tensor(float(i))], "bias": [tensor(float(i))]}
        else:
            rec = {"input_args": [tensor(float(i)), {"type": "int", "value": i}], "input_kwargs": {},
                   "output": [tensor(float(i))]}
        w.add(key, rec)
        w.add_construct(key, "Module.fc1.Linear.forward.0" if key.startswith("Functional.linear.0") else None)
        w.add_stack(key, ((here, 10 + i % 2, "fn"),))
    w.close()
    return str(rank_dir)


# -- our dumps ----------------------------------------------------------------------------------------
def test_reads_our_dump(tmp_path):
    d = write_dump(tmp_path / "step0" / "rank0")
    for path in (d, os.path.join(d, "dump.json")):
        r = DumpReader(path)
        assert (r.task, r.level, r.framework, r.dump_data_dir) == ("statistics", "mix", "pytorch", None)
        assert r.rank_dir == d and r.dump_file == os.path.join(d, "dump.json")
        assert r.keys() == KEYS and list(r) == KEYS and len(r) == len(KEYS)
        assert "Tensor.sum.0.forward" in r and "Tensor.sum.9.forward" not in r
        assert dict(r.items())["Tensor.sum.0.forward"]["output"][0]["Max"] == 5.0


def test_stack_and_construct_properties(tmp_path):
    r = DumpReader(write_dump(tmp_path / "step0" / "rank0"))
    assert set(r.stack) == set(KEYS)
    here = os.path.abspath(__file__)
    assert r.stack[KEYS[0]] == r.stack[KEYS[2]] != r.stack[KEYS[1]]  # deduplicated, still per key
    assert r.stack[KEYS[0]][0].startswith(f"File {here}, line 10, in fn")
    assert r.construct["Functional.linear.0.forward"] == "Module.fc1.Linear.forward.0"
    assert r.construct["Module.fc1.Linear.forward.0"] is None
    assert len(r.construct) == len(KEYS)


def test_stack_and_construct_absent(tmp_path):
    d = write_dump(tmp_path / "r")
    os.remove(os.path.join(d, "stack.json"))
    os.remove(os.path.join(d, "construct.json"))
    r = DumpReader(d)
    assert r.stack == {} and r.construct == {}


def test_older_msprobe_stack_format(tmp_path):
    """Older msProbe versions wrote stack.json as {key: [line, ...]}."""
    d = write_dump(tmp_path / "r")
    with open(os.path.join(d, "stack.json"), "w") as f:
        json.dump({"Functional.linear.0.forward": ["File a.py, line 1, in f, \n x()", "File b.py, line 2, in g"],
                   "Tensor.sum.0.forward": ["File c.py, line 3, in h, \n y()"]}, f)
    r = DumpReader(d)
    assert r.stack["Functional.linear.0.forward"] == ["File a.py, line 1, in f, \n x()", "File b.py, line 2, in g"]
    assert r.stack["Tensor.sum.0.forward"] == ["File c.py, line 3, in h, \n y()"]


def test_reads_debug_json(tmp_path):
    d = write_dump(tmp_path / "r", keys=["x.0.debug", "x_grad.0.debug"], level="debug", debug=True)
    assert not os.path.exists(os.path.join(d, "dump.json"))
    r = DumpReader(d)
    assert r.dump_file == os.path.join(d, "debug.json")
    assert r.level == "debug" and r.keys() == ["x.0.debug", "x_grad.0.debug"]


# -- resolve --------------------------------------------------------------------------------------------
def test_resolve_exact_index_and_unique_substring(tmp_path):
    r = DumpReader(write_dump(tmp_path / "r"))
    assert r.resolve("Functional.linear.1.forward") == "Functional.linear.1.forward"
    assert r.resolve(0) == KEYS[0]
    assert r.resolve(3) == KEYS[3]
    assert r.resolve(-1) == KEYS[-1]
    assert r.resolve("relu") == "Functional.relu.0.forward"
    assert r.resolve("fc2.Linear.forward") == "Module.fc2.Linear.forward.0"
    assert r.resolve("parameters_grad") == "Module.fc2.Linear.parameters_grad.0"
    assert r["relu"] is r.data["Functional.relu.0.forward"]
    assert r[1] is r.data[KEYS[1]]


def test_exact_key_wins_over_substring(tmp_path):
    keys = ["Functional.linear.1.forward", "Functional.linear.11.forward"]
    r = DumpReader(write_dump(tmp_path / "r", keys=keys))
    assert r.resolve("Functional.linear.1.forward") == "Functional.linear.1.forward"


def test_ambiguous_substring_lists_candidates(tmp_path):
    r = DumpReader(write_dump(tmp_path / "r"))
    with pytest.raises(KeyError) as info:
        r.resolve("linear")
    msg = str(info.value)
    linear = [k for k in KEYS if "linear" in k]
    assert f"matches {len(linear)} keys" in msg
    for k in linear:
        assert k in msg
    assert "Functional.relu.0.forward" not in msg
    with pytest.raises(KeyError, match="Tensor.sum.0.forward"):
        r["Tensor.sum"]


def test_ambiguous_substring_lists_at_most_ten(tmp_path):
    keys = [f"Functional.add.{i}.forward" for i in range(15)]
    r = DumpReader(write_dump(tmp_path / "r", keys=keys))
    with pytest.raises(KeyError) as info:
        r.resolve("add")
    msg = str(info.value)
    assert "matches 15 keys" in msg
    assert "Functional.add.9.forward" in msg and "Functional.add.14.forward" not in msg


def test_miss_suggests_nearest_keys(tmp_path):
    r = DumpReader(write_dump(tmp_path / "r"))
    with pytest.raises(KeyError) as info:
        r.resolve("Functional.linaer.1.forward")
    msg = str(info.value)
    assert "not in" in msg and r.dump_file in msg
    assert "nearest:" in msg and "Functional.linear.1.forward" in msg


def test_miss_without_near_key(tmp_path):
    r = DumpReader(write_dump(tmp_path / "r"))
    with pytest.raises(KeyError) as info:
        r.resolve("zzzzzzzzzzzzzzzzzzzzzzzzzzzzzz")
    assert "nearest" not in str(info.value)


# -- broken files ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.6, 0.95])
def test_truncated_dump_json_raises_format_error(tmp_path, fraction):
    d = write_dump(tmp_path / "r")
    path = os.path.join(d, "dump.json")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * fraction))
    with pytest.raises(DumpFormatError) as info:
        DumpReader(d)
    assert path in str(info.value)
    assert "truncated" in str(info.value)


def test_truncated_stack_json_raises_format_error_when_read(tmp_path):
    d = write_dump(tmp_path / "r")
    path = os.path.join(d, "stack.json")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    r = DumpReader(d)  # dump.json itself is fine
    with pytest.raises(DumpFormatError, match="stack.json"):
        r.stack


def test_not_a_dump(tmp_path):
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"task": "statistics"}))
    with pytest.raises(DumpFormatError, match="'data'"):
        DumpReader(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(DumpFormatError, match=str(path)):
        DumpReader(str(path))


def test_missing_dump(tmp_path):
    with pytest.raises(DumpFormatError, match="not found"):
        DumpReader(str(tmp_path))
    with pytest.raises(DumpFormatError, match="not found"):
        DumpReader(str(tmp_path / "dump.json"))


def test_format_error_is_msprobe_error():
    assert issubclass(DumpFormatError, MsprobeError)


# -- non-finite statistics ------------------------------------------------------------------------------
def test_bare_nan_infinity_tokens_are_read(tmp_path):
    path = tmp_path / "dump.json"
    path.write_text('{"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": null,\n'
                    ' "data": {"Torch.exp.0.forward": {"input_args": [], "input_kwargs": {}, "output": [\n'
                    '  {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2],\n'
                    '   "Max": Infinity, "Min": -Infinity, "Mean": NaN, "Norm": 1.5}]}}}\n')
    r = DumpReader(str(path))
    out = r["exp"]["output"][0]
    assert out["Max"] == math.inf and out["Min"] == -math.inf and math.isnan(out["Mean"])
    assert stat_value(out["Max"]) == math.inf and math.isnan(stat_value(out["Mean"]))


@pytest.mark.skipif(not os.path.isfile(OVERFLOW_DUMP), reason="msProbe overflow sample not found")
def test_msprobe_overflow_sample_with_bare_tokens():
    r = DumpReader(OVERFLOW_DUMP)
    out = r["Torch.exp.0.forward"]["output"][0]
    assert out["Max"] == math.inf and out["Min"] == 1.0
    assert all(math.isnan(r["Tensor.__sub__.0.forward"]["output"][0][s]) for s in ("Max", "Min", "Mean", "Norm"))


@pytest.mark.parametrize("value, expected", [
    ("inf", math.inf), ("-inf", -math.inf), ("Infinity", math.inf), ("-Infinity", -math.inf),
    (1.5, 1.5), (0, 0), (None, None), (True, True), ("abc", "abc"),
    (math.inf, math.inf),
])
def test_stat_value(value, expected):
    assert stat_value(value) == expected


@pytest.mark.parametrize("value", ["nan", "NaN", math.nan])
def test_stat_value_nan(value):
    assert math.isnan(stat_value(value))


def test_our_strings_round_trip_to_floats(tmp_path):
    w = DumpWriter(str(tmp_path / "r"), task="statistics", level="L1", framework="pytorch")
    w.add("Torch.exp.0.forward", {"input_args": [], "input_kwargs": {},
                                  "output": [dict(tensor(float("inf")), Min=float("-inf"), Mean=float("nan"))]})
    w.close()
    out = DumpReader(str(tmp_path / "r"))["exp"]["output"][0]
    assert (out["Max"], out["Min"], out["Mean"]) == ("inf", "-inf", "nan")  # strings on disk
    assert stat_value(out["Max"]) == math.inf and stat_value(out["Min"]) == -math.inf
    assert math.isnan(stat_value(out["Mean"])) and stat_value(out["Norm"]) == 1.0


def test_iter_tensor_records():
    value = [tensor(1.0), None, {"type": "int", "value": 3}, [tensor(2.0), {"k": tensor(3.0)}]]
    got = list(iter_tensor_records(value))
    assert [p for p, _ in got] == [(0,), (3, 0), (3, 1, "k")]
    assert [rec["Max"] for _, rec in got] == [1.0, 2.0, 3.0]


# -- find_rank_dirs -----------------------------------------------------------------------------------
@pytest.fixture
def dump_tree(tmp_path):
    root = tmp_path / "dump_path"
    for step in (0, 1, 10):
        for rank in (0, 1, 2):
            write_dump(root / f"step{step}" / f"rank{rank}", keys=KEYS[:2])
    write_dump(root / "step1" / "proc1234", keys=KEYS[:2])
    (root / "step0" / "rank7").mkdir()  # no dump.json: not a rank dir
    (root / "step0" / "notes.txt").write_text("x")
    (root / "step0" / "rankX").mkdir()
    (root / "other").mkdir()
    (root / "step99").write_text("a file named like a step dir")
    write_dump(root / "step2" / "rank0", keys=["x.0.debug"], level="debug", debug=True)
    return root


def test_find_rank_dirs_on_root(dump_tree):
    found = find_rank_dirs(str(dump_tree))
    got = [(r.step, r.rank, r.is_proc) for r in found]
    assert got == [(0, 0, False), (0, 1, False), (0, 2, False),
                   (1, 0, False), (1, 1, False), (1, 2, False), (1, 1234, True),
                   (2, 0, False),
                   (10, 0, False), (10, 1, False), (10, 2, False)]
    assert all(isinstance(r, RankDir) for r in found)
    assert found[0].path == os.path.join(str(dump_tree), "step0", "rank0")
    assert found[6].path.endswith(os.path.join("step1", "proc1234"))


def test_find_rank_dirs_on_step_dir(dump_tree):
    found = find_rank_dirs(str(dump_tree / "step1"))
    assert [(r.step, r.rank, r.is_proc) for r in found] == [(1, 0, False), (1, 1, False), (1, 2, False),
                                                            (1, 1234, True)]


def test_find_rank_dirs_on_rank_dir_and_file(dump_tree):
    d = dump_tree / "step10" / "rank2"
    expected = [RankDir(str(d), 10, 2, False)]
    assert find_rank_dirs(str(d)) == expected
    assert find_rank_dirs(str(d / "dump.json")) == expected
    assert find_rank_dirs(str(d) + os.sep) == expected
    assert find_rank_dirs(str(dump_tree / "step1" / "proc1234")) == \
        [RankDir(str(dump_tree / "step1" / "proc1234"), 1, 1234, True)]
    assert find_rank_dirs(str(dump_tree / "step2" / "rank0")) == \
        [RankDir(str(dump_tree / "step2" / "rank0"), 2, 0, False)]  # debug.json


def test_find_rank_dirs_relative_path(dump_tree, monkeypatch):
    monkeypatch.chdir(dump_tree)
    found = find_rank_dirs("step0")
    assert [r.rank for r in found] == [0, 1, 2]
    assert os.path.isabs(found[0].path)


def test_find_rank_dirs_on_plain_dir(tmp_path):
    d = tmp_path / "some_dir"
    d.mkdir()
    write_dump(d)
    assert find_rank_dirs(str(d)) == [RankDir(str(d), 0, 0, False)]


@pytest.mark.parametrize("sub", ["", "other", "step0/rank7", "step5", "missing", "missing/step3"])
def test_find_rank_dirs_error_without_dump(dump_tree, tmp_path, sub):
    root = tmp_path / "empty"
    root.mkdir()
    (root / "step0" / "rank0").mkdir(parents=True)
    (root / "step5").mkdir()
    (root / "step99").write_text("not a dir")
    (root / "other").mkdir()
    (root / "step0" / "rank7").mkdir()
    target = str(root / sub) if sub else str(root)
    with pytest.raises(MsprobeError) as info:
        find_rank_dirs(target)
    assert "no dump found" in str(info.value)
    assert os.path.abspath(target) in str(info.value)


# -- msProbe samples --------------------------------------------------------------------------------
@needs_samples
@pytest.mark.parametrize("sample", SAMPLE_DIRS, ids=lambda d: "/".join(d.rstrip("/").split("/")[-2:]))
def test_reads_msprobe_sample(sample):
    with open(os.path.join(sample, "config.json")) as f:
        cfg = json.load(f)
    r = DumpReader(sample)
    name = "debug.json" if cfg["level"] == "debug" else "dump.json"
    assert r.dump_file == os.path.join(sample, name)
    assert r.task == cfg["task"] and r.level == cfg["level"]
    assert r.framework in ("pytorch", "mindspore")
    if cfg["task"] == "structure":
        assert len(r) == 0
    else:
        assert len(r) > 0
        for i, key in enumerate(r.keys()):
            assert r.resolve(key) == key and r.resolve(i) == key
    # stack.json: every key listed there maps to a list of "File ..., line N, in fn" lines
    stack_path = os.path.join(sample, "stack.json")
    if os.path.isfile(stack_path):
        with open(stack_path) as f:
            raw = json.load(f)
        listed = {k for keys, _ in raw.values() for k in keys}
        assert listed and set(r.stack) == listed
        for key, lines in r.stack.items():
            assert lines and all(line.startswith("File ") for line in lines), key
    else:
        assert r.stack == {}
    # construct.json: empty at L1, a map to parents (or None) at L0/mix
    construct_path = os.path.join(sample, "construct.json")
    if cfg["level"] in ("L0", "mix"):
        assert r.construct and all(v is None or isinstance(v, str) for v in r.construct.values())
        # module calls have a construct entry; msProbe lists no parameters_grad keys there
        modules = {k for k in r.keys() if k.startswith(("Module.", "Cell.")) and "parameters_grad" not in k}
        assert modules <= set(r.construct)
    elif os.path.isfile(construct_path):
        assert r.construct == {}


@needs_samples
def test_msprobe_sample_tensor_records_and_stats():
    d = os.path.join(SAMPLES, "pt_dump", "mlp_statistics_L1_md5")
    r = DumpReader(d)
    rec = r["Functional.linear.0.forward"]
    tensors = list(iter_tensor_records(rec["input_args"]))
    assert tensors and all(t["type"] == "torch.Tensor" and "md5" in t for _, t in tensors)
    assert all(isinstance(stat_value(t["Max"]), float) for _, t in tensors)


@needs_samples
def test_msprobe_sample_dir_copied_into_dump_tree(tmp_path):
    """A msProbe rank dir placed as step0/rank3 is found by find_rank_dirs and read."""
    src = os.path.join(SAMPLES, "pt_dump", "mlp_statistics_mix_xor")
    dst = tmp_path / "dump" / "step0" / "rank3"
    shutil.copytree(src, dst)
    [rd] = find_rank_dirs(str(tmp_path / "dump"))
    assert (rd.step, rd.rank, rd.is_proc) == (0, 3, False)
    r = DumpReader(rd.path)
    assert r.level == "mix" and "Module.body.0.Linear.forward.0" in r
    assert r.construct["Functional.linear.0.forward"] == "Module.body.0.Linear.forward.0"

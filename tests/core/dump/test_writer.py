"""JsonAppendFile and DumpWriter: files valid after every append, submission order kept while records
wait for background work, stack.json deduplication, dump_error_info.log only on errors.

No torch here: records are plain dicts, background work is real futures / a real thread pool.
"""

import json
import math
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from msprobe.core.dump.json_append import JsonAppendFile, json_float
from msprobe.core.dump.reader import DumpReader
from msprobe.core.dump.writer import DumpWriter, rank_dir_name, step_rank_dir
from msprobe.core.stack import capture_stack


def strict_load(path):
    """json.load that refuses the bare NaN/Infinity tokens (not JSON)."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    with open(path, encoding="utf-8") as f:
        return json.load(f, parse_constant=refuse)


def tensor(mx, mn=0.0, mean=0.0, norm=0.0):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2],
            "Max": json_float(mx), "Min": json_float(mn), "Mean": json_float(mean), "Norm": json_float(norm),
            "requires_grad": False}


def fwd(i):
    return {"input_args": [tensor(float(i))], "input_kwargs": {}, "output": [tensor(float(i) + 1)]}


def make_writer(tmp_path, **kw):
    kw.setdefault("task", "statistics")
    kw.setdefault("level", "L1")
    kw.setdefault("framework", "pytorch")
    return DumpWriter(str(tmp_path / "step0" / "rank0"), **kw)


# -- JsonAppendFile ------------------------------------------------------------------------------------
def test_empty_file_is_valid(tmp_path):
    path = str(tmp_path / "a.json")
    f = JsonAppendFile(path)
    assert strict_load(path) == {}
    f.close()
    assert strict_load(path) == {}


def test_file_parses_after_every_append(tmp_path):
    path = str(tmp_path / "a.json")
    f = JsonAppendFile(path)
    expected = {}
    values = [None, 1, 2.5, "s", [1, [2, {"x": None}]], {"nested": {"k": [True, False]}}, "quote\"\n\\",
              "ünïcode ✓"]
    for i, v in enumerate(values):
        key = f"key.{i}"
        f.append(key, v)
        expected[key] = v
        assert strict_load(path) == expected  # whole file, exactly the appends so far, in order
        assert list(strict_load(path)) == list(expected)
    f.close()
    assert strict_load(path) == expected


def test_envelope_head_and_trailer(tmp_path):
    path = str(tmp_path / "d.json")
    f = JsonAppendFile(path, head='{\n "task": "statistics",\n "data": {', trailer="\n }\n}\n", indent="\n  ")
    assert strict_load(path) == {"task": "statistics", "data": {}}
    f.append("a", 1)
    assert strict_load(path) == {"task": "statistics", "data": {"a": 1}}
    f.append("b", [2])
    assert strict_load(path) == {"task": "statistics", "data": {"a": 1, "b": [2]}}
    f.close()


def test_existing_file_is_truncated(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("x" * 10000)
    f = JsonAppendFile(str(path))
    f.append("k", 1)
    f.close()
    assert strict_load(str(path)) == {"k": 1}


def test_concurrent_appends_stay_valid(tmp_path):
    path = str(tmp_path / "a.json")
    f = JsonAppendFile(path)

    def work(t):
        for i in range(200):
            f.append(f"t{t}.{i}", {"v": i})
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    f.close()
    data = strict_load(path)
    assert len(data) == 800
    for t in range(4):  # each thread's appends in its own order
        mine = [k for k in data if k.startswith(f"t{t}.")]
        assert mine == [f"t{t}.{i}" for i in range(200)]


@pytest.mark.parametrize("x, expected", [(float("inf"), "inf"), (float("-inf"), "-inf"), (float("nan"), "nan"),
                                         (1.5, 1.5), (0.0, 0.0), (-3.0, -3.0), (None, None), (7, 7)])
def test_json_float(x, expected):
    assert json_float(x) == expected


def test_non_finite_floats_are_written_as_strings(tmp_path):
    path = str(tmp_path / "a.json")
    f = JsonAppendFile(path)
    f.append("stats", {"Max": float("inf"), "Min": float("-inf"), "Mean": float("nan"), "Norm": 1.0,
                       "nested": [float("nan"), (float("inf"), 2.0)]})
    f.close()
    text = open(path).read()
    assert "NaN" not in text and "Infinity" not in text
    assert strict_load(path) == {"stats": {"Max": "inf", "Min": "-inf", "Mean": "nan", "Norm": 1.0,
                                           "nested": ["nan", ["inf", 2.0]]}}


def test_finite_file_writes_nulls_as_they_are(tmp_path):
    """A file opened `finite` trusts its values: None stays null without the slow re-encode."""
    path = str(tmp_path / "a.json")
    f = JsonAppendFile(path, finite=True)
    f.append("call", {"input_kwargs": {"bias": None}, "output": [None, {"Max": 1.0, "Mean": None}]})
    f.close()
    assert strict_load(path) == {"call": {"input_kwargs": {"bias": None},
                                          "output": [None, {"Max": 1.0, "Mean": None}]}}


# -- DumpWriter: envelope and records ------------------------------------------------------------------
def test_rank_dir_names(tmp_path):
    assert rank_dir_name(3) == "rank3"
    assert rank_dir_name(0) == "rank0"
    assert rank_dir_name(None, pid=42) == "proc42"
    assert rank_dir_name(None) == f"proc{os.getpid()}"
    assert step_rank_dir("d", 2, 1) == os.path.join("d", "step2", "rank1")


def test_envelope_and_files(tmp_path):
    w = make_writer(tmp_path, level="mix")
    rank_dir = tmp_path / "step0" / "rank0"
    doc = strict_load(rank_dir / "dump.json")
    assert doc == {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None,
                   "data": {}}
    assert strict_load(rank_dir / "construct.json") == {}
    assert not (rank_dir / "dump_tensor_data").exists()
    w.close()
    assert sorted(os.listdir(rank_dir)) == ["construct.json", "dump.json", "stack.json"]
    assert strict_load(rank_dir / "stack.json") == {}


def test_tensor_dir_and_debug_json(tmp_path):
    w = DumpWriter(str(tmp_path / "r"), task="tensor", level="debug", framework="pytorch", debug=True,
                   with_tensors=True)
    w.add("x.0.debug", tensor(1.0))
    w.close()
    assert (tmp_path / "r" / "dump_tensor_data").is_dir()
    assert not (tmp_path / "r" / "dump.json").exists()
    doc = strict_load(tmp_path / "r" / "debug.json")
    assert doc["dump_data_dir"] == os.path.abspath(tmp_path / "r" / "dump_tensor_data")
    assert doc["level"] == "debug" and list(doc["data"]) == ["x.0.debug"]
    assert w.tensor_path("a.npy") == os.path.join(str(tmp_path / "r" / "dump_tensor_data"), "a.npy")


def test_dump_json_parses_after_each_record(tmp_path):
    w = make_writer(tmp_path)
    path = tmp_path / "step0" / "rank0" / "dump.json"
    keys = []
    for i in range(20):
        key = f"Functional.linear.{i}.forward"
        w.add(key, fwd(i))
        keys.append(key)
        doc = strict_load(path)  # no flush, no close: valid right away
        assert list(doc["data"]) == keys
        assert doc["data"][key] == fwd(i)
        assert w.records == i + 1
    w.close()


def test_non_finite_statistics_in_dump_json(tmp_path):
    w = make_writer(tmp_path)
    w.add("Functional.exp.0.forward", {"input_args": [tensor(float("inf"), float("-inf"), float("nan"), 1.0)],
                                        "input_kwargs": {}, "output": []})
    # a raw non-finite float that did not go through json_float still yields strict JSON
    w.add("Functional.log.0.forward", {"input_args": [{"type": "float", "value": float("-inf")}],
                                       "input_kwargs": {}, "output": [{"Max": float("nan")}]})
    w.close()
    path = tmp_path / "step0" / "rank0" / "dump.json"
    text = open(path).read()
    assert "NaN" not in text and "Infinity" not in text
    data = strict_load(path)["data"]
    rec = data["Functional.exp.0.forward"]["input_args"][0]
    assert (rec["Max"], rec["Min"], rec["Mean"], rec["Norm"]) == ("inf", "-inf", "nan", 1.0)
    assert data["Functional.log.0.forward"]["input_args"][0]["value"] == "-inf"
    assert data["Functional.log.0.forward"]["output"][0]["Max"] == "nan"


# -- DumpWriter: held-back records ------------------------------------------------------------------
def test_pending_record_holds_back_later_ones(tmp_path):
    w = make_writer(tmp_path)
    path = tmp_path / "step0" / "rank0" / "dump.json"
    w.add("A.a.0.forward", fwd(0))
    crc = Future()
    rec = fwd(1)
    rec["output"][0]["md5"] = None
    crc.add_done_callback(lambda f, r=rec: r["output"][0].__setitem__("md5", f.result()))  # fills the record
    w.add("B.b.0.forward", rec, waits=[crc])
    w.add("C.c.0.forward", fwd(2))
    w.add("D.d.0.forward", fwd(3))
    assert list(strict_load(path)["data"]) == ["A.a.0.forward"]  # B pending, C and D wait behind it
    assert w.records == 1
    crc.set_result("0badf00d")
    data = strict_load(path)["data"]
    assert list(data) == ["A.a.0.forward", "B.b.0.forward", "C.c.0.forward", "D.d.0.forward"]
    assert data["B.b.0.forward"]["output"][0]["md5"] == "0badf00d"  # written after the future filled it
    assert w.records == 4
    w.close()


def test_record_waiting_on_several_futures(tmp_path):
    w = make_writer(tmp_path)
    path = tmp_path / "step0" / "rank0" / "dump.json"
    f1, f2 = Future(), Future()
    w.add("A.a.0.forward", fwd(0), waits=[f1, f2])
    w.add("B.b.0.forward", fwd(1))
    f2.set_result(None)
    assert strict_load(path)["data"] == {}
    f1.set_result(None)
    assert list(strict_load(path)["data"]) == ["A.a.0.forward", "B.b.0.forward"]
    w.close()


def test_already_done_future_does_not_hold_back(tmp_path):
    w = make_writer(tmp_path)
    done = Future()
    done.set_result(None)
    w.add("A.a.0.forward", fwd(0), waits=[done])
    assert list(strict_load(tmp_path / "step0" / "rank0" / "dump.json")["data"]) == ["A.a.0.forward"]
    w.close()


def test_submission_order_with_real_pool(tmp_path):
    """Slow work first, fast work later: dump.json still lists records in submission order."""
    pool = ThreadPoolExecutor(max_workers=4)
    try:
        w = make_writer(tmp_path, pool=pool)
        keys = []
        for i in range(12):
            key = f"Functional.op{i}.0.forward"
            keys.append(key)
            delay = 0.05 * (12 - i) / 12 if i % 3 == 0 else 0.0
            waits = [w.submit(lambda d=delay: time.sleep(d), nbytes=100)] if i % 2 == 0 else []
            w.add(key, fwd(i), waits=waits)
        w.flush()
        assert list(strict_load(tmp_path / "step0" / "rank0" / "dump.json")["data"]) == keys
        assert w.records == 12
        w.close()
    finally:
        pool.shutdown(wait=True)


def test_writer_owned_pool(tmp_path):
    w = make_writer(tmp_path)  # no pool given: one is created on first submit and shut down on close
    fut = w.submit(lambda: 41 + 1)
    w.add("A.a.0.forward", fwd(0), waits=[fut])
    w.close()
    assert fut.result() == 42
    assert list(strict_load(tmp_path / "step0" / "rank0" / "dump.json")["data"]) == ["A.a.0.forward"]


def test_flush_waits_for_pending_records(tmp_path):
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        w = make_writer(tmp_path, pool=pool)
        w.add("A.a.0.forward", fwd(0), waits=[w.submit(lambda: time.sleep(0.2))])
        w.add("B.b.0.forward", fwd(1))
        w.flush()
        assert list(strict_load(tmp_path / "step0" / "rank0" / "dump.json")["data"]) == \
            ["A.a.0.forward", "B.b.0.forward"]
        w.close()
    finally:
        pool.shutdown()


# -- errors -------------------------------------------------------------------------------------------
def test_no_error_log_without_errors(tmp_path):
    w = make_writer(tmp_path)
    w.add("A.a.0.forward", fwd(0))
    w.close()
    assert not (tmp_path / "step0" / "rank0" / "dump_error_info.log").exists()


def test_error_log_created_by_log_error(tmp_path):
    w = make_writer(tmp_path)
    log = tmp_path / "step0" / "rank0" / "dump_error_info.log"
    assert not log.exists()
    w.log_error("first problem")
    assert log.exists()
    w.log_error("second problem")
    w.close()
    lines = log.read_text().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("first problem") and lines[1].endswith("second problem")


def test_failed_future_is_logged_and_record_still_written(tmp_path):
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        w = make_writer(tmp_path, pool=pool)

        def boom():
            raise OSError("disk full")
        w.add("A.a.0.forward", fwd(0), waits=[w.submit(boom)])
        w.add("B.b.0.forward", fwd(1))
        w.close()
    finally:
        pool.shutdown()
    rank_dir = tmp_path / "step0" / "rank0"
    assert list(strict_load(rank_dir / "dump.json")["data"]) == ["A.a.0.forward", "B.b.0.forward"]
    log = (rank_dir / "dump_error_info.log").read_text()
    assert "A.a.0.forward" in log and "disk full" in log


# -- construct.json and stack.json ------------------------------------------------------------------
def test_construct_json_valid_after_each_append(tmp_path):
    w = make_writer(tmp_path, level="mix")
    path = tmp_path / "step0" / "rank0" / "construct.json"
    w.add_construct("Module.fc.Linear.forward.0", None)
    assert strict_load(path) == {"Module.fc.Linear.forward.0": None}
    w.add_construct("Functional.linear.0.forward", "Module.fc.Linear.forward.0")
    assert strict_load(path) == {"Module.fc.Linear.forward.0": None,
                                 "Functional.linear.0.forward": "Module.fc.Linear.forward.0"}
    w.close()


def _frames(line_a, line_b):
    here = os.path.abspath(__file__)
    return ((here, line_a, "inner"), (here, line_b, "outer"))


def test_stack_json_merges_captures_that_read_the_same(tmp_path):
    """Two calls on one line are two captured stacks (different instructions) but one stack.json
    entry; keys keep the order they came in."""
    w = make_writer(tmp_path)
    first, second = capture_stack(), capture_stack()
    assert first != second
    w.add_stack("Functional.linear.0.forward", first)
    w.add_stack("Functional.relu.0.forward", capture_stack())
    w.add_stack("Functional.linear.1.forward", second)
    w.close()
    stacks = strict_load(tmp_path / "step0" / "rank0" / "stack.json")
    assert [keys for keys, _ in stacks.values()] == [
        ["Functional.linear.0.forward", "Functional.linear.1.forward"], ["Functional.relu.0.forward"]]
    assert "first, second = capture_stack(), capture_stack()" in stacks["0"][1][0]


def test_stack_json_dedupes_identical_stacks(tmp_path):
    lineno = sys._getframe().f_lineno  # this very line is quoted in stack.json
    w = make_writer(tmp_path)
    same = _frames(lineno, lineno + 1)
    other = _frames(lineno + 1, lineno)
    w.add_stack("Functional.linear.0.forward", same)
    w.add_stack("Functional.relu.0.forward", other)
    w.add_stack("Functional.linear.1.forward", same)
    w.add_stack("Functional.linear.2.forward", tuple(same))  # equal tuple, different object
    # valid from the start, filled in at flush
    assert strict_load(tmp_path / "step0" / "rank0" / "stack.json") == {}
    w.flush()
    stacks = strict_load(tmp_path / "step0" / "rank0" / "stack.json")
    assert list(stacks) == ["0", "1"]
    keys0, lines0 = stacks["0"]
    keys1, lines1 = stacks["1"]
    assert keys0 == ["Functional.linear.0.forward", "Functional.linear.1.forward", "Functional.linear.2.forward"]
    assert keys1 == ["Functional.relu.0.forward"]
    here = os.path.abspath(__file__)
    assert lines0[0].startswith(f"File {here}, line {lineno}, in inner, \n")
    assert "lineno = sys._getframe().f_lineno" in lines0[0]  # the source line is quoted
    assert lines0[1].startswith(f"File {here}, line {lineno + 1}, in outer, \n")
    assert lines1[0].startswith(f"File {here}, line {lineno + 1}, in inner")
    w.close()
    # the reader maps every key to its stack
    r = DumpReader(str(tmp_path / "step0" / "rank0"))
    assert r.stack["Functional.linear.0.forward"] == lines0
    assert r.stack["Functional.linear.2.forward"] == lines0
    assert r.stack["Functional.relu.0.forward"] == lines1


def test_stack_json_rewritten_at_each_flush(tmp_path):
    w = make_writer(tmp_path)
    f = _frames(1, 2)
    w.add_stack("a.0.forward", f)
    w.flush()
    w.add_stack("b.0.forward", f)
    w.flush()
    stacks = strict_load(tmp_path / "step0" / "rank0" / "stack.json")
    assert stacks["0"][0] == ["a.0.forward", "b.0.forward"]
    assert not (tmp_path / "step0" / "rank0" / "stack.json.tmp").exists()
    w.close()


def test_written_dump_reads_back(tmp_path):
    w = make_writer(tmp_path, level="mix")
    w.add("Module.fc.Linear.forward.0", dict(fwd(0), parameters={"weight": tensor(2.0)}))
    w.add_construct("Module.fc.Linear.forward.0", None)
    w.add("Module.fc.Linear.parameters_grad.0", {"weight": [tensor(float("nan"))]})
    w.close()
    r = DumpReader(str(tmp_path / "step0" / "rank0"))
    assert (r.task, r.level, r.framework) == ("statistics", "mix", "pytorch")
    assert r.keys() == ["Module.fc.Linear.forward.0", "Module.fc.Linear.parameters_grad.0"]
    assert r["parameters_grad"]["weight"][0]["Max"] == "nan"
    assert math.isnan(float(r["parameters_grad"]["weight"][0]["Max"]))
    assert r.construct == {"Module.fc.Linear.forward.0": None}


def test_structure_false_writes_neither_construct_nor_stack(tmp_path):
    """level debug / extra_info false (msProbe): only the data file is written."""
    w = DumpWriter(str(tmp_path / "r"), task="statistics", level="mix", framework="pytorch", structure=False)
    w.add("Functional.relu.0.forward", {"input_args": [], "input_kwargs": {}, "output": []})
    w.add_construct("Functional.relu.0.forward", "Module.a.A.forward.0")
    w.add_stack("Functional.relu.0.forward", ((__file__, 1, "f"),))
    w.close()
    assert sorted(os.listdir(tmp_path / "r")) == ["dump.json"]
    assert list(DumpReader(str(tmp_path / "r")).keys()) == ["Functional.relu.0.forward"]


@pytest.mark.parametrize("dump_path_exists, step_exists", [(True, False), (True, True), (False, False)])
def test_rank_dir_made_whatever_exists_already(tmp_path, dump_path_exists, step_exists):
    root = tmp_path / "dump" if dump_path_exists else tmp_path / "missing" / "dump"
    if dump_path_exists:
        root.mkdir()
    if step_exists:
        (root / "step3" / "rank0").mkdir(parents=True)  # another rank made the step directory first
    w = DumpWriter(step_rank_dir(str(root), 3, 1), task="statistics", level="L1", framework="pytorch")
    w.add("Torch.add.0.forward", {"input_args": [], "input_kwargs": {}, "output": []})
    w.close()
    assert list(DumpReader(str(root / "step3" / "rank1")).keys()) == ["Torch.add.0.forward"]
    again = DumpWriter(step_rank_dir(str(root), 3, 1), task="statistics", level="L1", framework="pytorch")
    again.close()  # the same rank directory again (a re-run into the same dump path)

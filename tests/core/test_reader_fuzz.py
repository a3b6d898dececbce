"""Fuzz the readers of dump.json, stack.json, construct.json and compare.json with Hypothesis: any
bytes, any JSON, and cut-short or bit-flipped real files give a result or one MsprobeError line, never
another exception and never a hang (each example has a deadline)."""

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msprobe.core.dump.reader import DumpReader, load_stack
from msprobe.core.dump.summary import summarize_dump
from msprobe.core.errors import MsprobeError

FUZZ = settings(max_examples=100, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                            st.dictionaries(st.text(max_size=10), inner, max_size=5)),
                           max_leaves=30)
TENSOR = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 1.0, "Min": -1.0, "Mean": 0.0,
          "Norm": 2.0, "requires_grad": True}
VALID_DUMP = json.dumps({"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "data": {
    "Functional.linear.0.forward": {"input_args": [TENSOR, TENSOR], "input_kwargs": {}, "output": [TENSOR]},
    "Module.fc.Linear.forward.0": {"input_args": [TENSOR], "output": [TENSOR]}}}).encode()
VALID_STACK = json.dumps({"0": [["Functional.linear.0.forward"], ["File a.py, line 1, in f", "y = g(x)"]]}).encode()
VALID_CONSTRUCT = json.dumps({"Functional.linear.0.forward": "Module.fc.Linear.forward.0",
                              "Module.fc.Linear.forward.0": None}).encode()


def damaged(valid):
    """Bytes of a real file, cut short or with some bytes overwritten."""
    cut = st.integers(0, len(valid)).map(lambda n: valid[:n])
    flipped = st.lists(st.tuples(st.integers(0, len(valid) - 1), st.integers(0, 255)), min_size=1, max_size=8).map(
        lambda edits: bytes(_edit(bytearray(valid), edits)))
    return st.one_of(cut, flipped)


def _edit(buf, edits):
    for i, b in edits:
        buf[i] = b
    return buf


def contents(valid):
    return st.one_of(st.binary(max_size=300), json_values.map(lambda v: json.dumps(v).encode()), damaged(valid),
                     json_values.map(lambda v: json.dumps({"data": v, "task": v}).encode()))


def one_line_or_result(read):
    try:
        return read()
    except MsprobeError as e:
        text = str(e)
        assert text and "\n" not in text, repr(text)
        return None


@pytest.fixture
def rank_dir(tmp_path):
    d = tmp_path / "step0" / "rank0"
    d.mkdir(parents=True)
    return d


@FUZZ
@given(raw=contents(VALID_DUMP))
def test_dump_json(rank_dir, raw):
    (rank_dir / "dump.json").write_bytes(raw)
    one_line_or_result(lambda: DumpReader(str(rank_dir)))
    one_line_or_result(lambda: summarize_dump(str(rank_dir)))


@FUZZ
@given(raw=contents(VALID_STACK))
def test_stack_json(rank_dir, raw):
    (rank_dir / "dump.json").write_bytes(VALID_DUMP)
    (rank_dir / "stack.json").write_bytes(raw)
    one_line_or_result(lambda: DumpReader(str(rank_dir)).stack)
    one_line_or_result(lambda: load_stack(str(rank_dir / "stack.json")))


@FUZZ
@given(raw=contents(VALID_CONSTRUCT))
def test_construct_json(rank_dir, raw):
    (rank_dir / "dump.json").write_bytes(VALID_DUMP)
    (rank_dir / "construct.json").write_bytes(raw)
    one_line_or_result(lambda: DumpReader(str(rank_dir)).construct)


@FUZZ
@given(doc=st.one_of(json_values, st.fixed_dictionaries({}, optional={
    "npu_path": st.one_of(st.just("RANK"), scalars), "bench_path": st.one_of(st.just("RANK"), scalars),
    "stack_path": st.one_of(st.just("RANK"), scalars), "is_print_compare_log": scalars})))
def test_compare_json(rank_dir, doc):
    """The compare.json reader of compare -i (golden required) and graph -i (golden optional)."""
    from msprobe.core.compare.compare_json import read_compare_json
    (rank_dir / "dump.json").write_bytes(VALID_DUMP)
    if isinstance(doc, dict):
        doc = {k: (str(rank_dir) if v == "RANK" else v) for k, v in doc.items()}
    path = rank_dir.parent / "compare.json"
    path.write_text(json.dumps(doc))
    one_line_or_result(lambda: read_compare_json(str(path)))
    one_line_or_result(lambda: read_compare_json(str(path), golden_required=False))
    os.remove(path)

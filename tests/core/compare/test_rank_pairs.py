"""`msprobe compare` of many rank pairs, one pair at a time in worker processes: the same files and
diagnosis as comparing everything in memory, the working precision decided over all pairs, a
suspect's evidence read again when it was let go, and each worker's log lines said once."""

import functools
import glob
import json
import logging
import os

import orjson
import pandas as pd
import pytest

from msprobe.core.compare import compare_dumps, write_compare
from msprobe.core.compare import rank_pairs
from msprobe.core.diagnosis import diagnose
from msprobe.core.diagnosis.evidence import trim_evidence

RANKS, STEPS, CALLS = 4, 2, 60
PLANT_RANK, PLANT_STEP, PLANT_CALL = 1, 1, 30


def _tensor(value, dtype):
    return {"type": "torch.Tensor", "dtype": dtype, "shape": [64], "Max": value, "Min": -value,
            "Mean": value / 10, "Norm": value * 3, "requires_grad": True}


def write_dumps(root, planted, target_dtypes=None, extra_call=False, rounded=None):
    """RANKS ranks x STEPS steps of CALLS calls; the planted side's PLANT_RANK drifts from PLANT_CALL of
    PLANT_STEP on. `target_dtypes`: rank -> dtype of that rank's tensors (float32 otherwise);
    `rounded`: (rank, calls) that ran in bfloat16 (inputs cast before them, not lowered by the call itself)
    and whose outputs are 0.1 % off, as rounding to it makes them."""
    for step in range(STEPS):
        for rank in range(RANKS):
            dtype = (target_dtypes or {}).get(rank, "torch.float32")
            data, counts, drift = {}, {}, 1.0
            for i in range(CALLS + (1 if extra_call else 0)):
                if planted and (step, rank, i) == (PLANT_STEP, PLANT_RANK, PLANT_CALL):
                    drift = 1.05
                in_dtype, out_dtype, off = dtype, dtype, 1.0
                if rounded and rank == rounded[0] and i in rounded[1]:
                    in_dtype, out_dtype, off = "torch.bfloat16", "torch.bfloat16", 1.001
                name = ("Functional.linear", "Functional.relu", "Tensor.__add__")[i % 3]
                index = counts.get(name, 0)
                counts[name] = index + 1
                x = 1.0 + (i % 7) / 7 + step
                data[f"{name}.{index}.forward"] = {
                    "input_args": [_tensor(x, in_dtype), _tensor(x / 2, in_dtype)], "input_kwargs": {},
                    "output": [_tensor((x + 0.5) * drift * off, out_dtype)]}
            d = os.path.join(root, f"step{step}", f"rank{rank}")
            os.makedirs(d)
            doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
            with open(os.path.join(d, "dump.json"), "wb") as f:
                f.write(orjson.dumps(doc))
    return str(root)


@pytest.fixture
def in_workers(monkeypatch):
    """Worker processes whatever the size of the dumps."""
    monkeypatch.setattr(rank_pairs, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(rank_pairs, "PARALLEL_MIN_PAIRS", 2)


def _files(folder):
    return {os.path.basename(p).rsplit("_", 1)[0]: pd.read_csv(p) for p in glob.glob(os.path.join(folder, "*.csv"))}


def _in_memory(target, golden, out):
    """What compare writes when every pair stays in memory (the tables kept)."""
    return write_compare(target, golden, str(out), progress=False, timestamp="20260101000000")


def _one_at_a_time(target, golden, out, **kwargs):
    return write_compare(target, golden, str(out), progress=False, keep_tables=False,
                         timestamp="20260101000000", **kwargs)


def assert_same_outputs(a, b):
    with open(a.diagnosis_path) as fa, open(b.diagnosis_path) as fb:
        assert json.load(fa) == json.load(fb)
    fa, fb = _files(os.path.dirname(a.diagnosis_path)), _files(os.path.dirname(b.diagnosis_path))
    assert sorted(fa) == sorted(fb) and len(fa) == RANKS * STEPS
    for name in fa:
        pd.testing.assert_frame_equal(fa[name], fb[name])


def test_workers_write_what_one_process_writes(tmp_path, in_workers):
    target = write_dumps(tmp_path / "t", True)
    golden = write_dumps(tmp_path / "g", False)
    kept = _in_memory(target, golden, tmp_path / "kept")
    streamed = _one_at_a_time(target, golden, tmp_path / "streamed")
    assert_same_outputs(kept, streamed)
    top = streamed.diagnosis["suspects"][0]
    assert top["ranks"] == [PLANT_RANK] and top["step"] == PLANT_STEP
    assert all(r.table is None and r.row_count == CALLS * 3 for r in streamed.results)
    assert sum(r.counts.get("pass", 0) + r.counts.get("error", 0) + r.counts.get("warning", 0)
               for r in streamed.results) == RANKS * STEPS * CALLS * 3
    assert diagnose(compare_dumps(target, golden, progress=False)) == streamed.diagnosis


def test_trimmed_evidence_is_read_again_when_listed(tmp_path, in_workers, monkeypatch):
    """Every suspect's rows let go in the workers: the listed ones come back with the same evidence."""
    monkeypatch.setattr(rank_pairs, "trim_evidence", functools.partial(trim_evidence, keep=0))
    target = write_dumps(tmp_path / "t", True)
    golden = write_dumps(tmp_path / "g", False)
    streamed = _one_at_a_time(target, golden, tmp_path / "streamed")
    assert streamed.diagnosis["suspects"][0]["inputs"]  # evidence, not an empty shell
    assert_same_outputs(_in_memory(target, golden, tmp_path / "kept"), streamed)


def test_working_precision_is_decided_over_all_pairs(tmp_path, in_workers):
    """Ranks 0-2 ran in bfloat16; rank 3 in float32 but for four calls made in bfloat16 (cast
    inputs; a call lowering float32 itself would be autocast's mark), their outputs 0.1 % off. Alone, rank 3
    has too few bfloat16 values to be a bfloat16 run, so those four diverge; over all pairs the run's
    precision is bfloat16, whose rounding explains them, and rank 3 is labelled with it, as in memory."""
    target = write_dumps(tmp_path / "t", False, target_dtypes={0: "torch.bfloat16", 1: "torch.bfloat16",
                                                                2: "torch.bfloat16"}, rounded=(3, range(30, 34)))
    golden = write_dumps(tmp_path / "g", False)
    streamed = _one_at_a_time(target, golden, tmp_path / "streamed")
    assert streamed.diagnosis["precision"]["working"] == "bfloat16"
    assert not streamed.diagnosis["divergence"], streamed.diagnosis["verdict"]
    alone = _one_at_a_time(os.path.join(target, "step1", "rank3"), os.path.join(golden, "step1", "rank3"),
                           tmp_path / "alone")
    assert alone.diagnosis["divergence"]
    assert_same_outputs(_in_memory(target, golden, tmp_path / "kept"), streamed)


def test_a_workers_log_line_is_said_once(tmp_path, in_workers, caplog):
    """Every rank's target calls an API once more than golden: each worker logs the alignment; the
    user reads it once."""
    target = write_dumps(tmp_path / "t", False, extra_call=True)
    golden = write_dumps(tmp_path / "g", False)
    with caplog.at_level(logging.INFO, logger="msprobe"):
        _one_at_a_time(target, golden, tmp_path / "streamed")
    said = [r.getMessage() for r in caplog.records if "aligning the two call sequences" in r.getMessage()]
    assert len(said) == 1, said


def test_bad_precision_fails_before_any_pair_is_compared(tmp_path, in_workers):
    from msprobe.core.errors import ConfigError
    target = write_dumps(tmp_path / "t", False)
    with pytest.raises(ConfigError, match="precision"):
        _one_at_a_time(target, target, tmp_path / "out", precision="float7")
    assert not glob.glob(str(tmp_path / "out" / "*.csv"))


def test_a_corrupt_rank_is_reported_and_the_others_compared(tmp_path, in_workers):
    target = write_dumps(tmp_path / "t", True)
    golden = write_dumps(tmp_path / "g", False)
    with open(os.path.join(target, "step1", "rank2", "dump.json"), "r+b") as f:
        f.truncate(100)
    out = _one_at_a_time(target, golden, tmp_path / "out")
    assert len(out.failed_pairs) == 1 and out.failed_pairs[0].startswith("step 1 rank 2: skipped: ")
    assert out.diagnosis["failed_pairs"][0]["step"] == 1 and out.diagnosis["failed_pairs"][0]["rank"] == 2
    assert len(out.results) == RANKS * STEPS - 1
    assert out.diagnosis["suspects"][0]["ranks"] == [PLANT_RANK]  # the rest still diagnosed


def test_resume_on_the_pool_skips_completed_pairs(tmp_path, in_workers):
    """Parts of half the pairs left by an interrupted run: --resume compares only the others and writes
    what an uninterrupted run writes."""
    pytest.importorskip("pyarrow")
    target = write_dumps(tmp_path / "t", True)
    golden = write_dumps(tmp_path / "g", False)
    whole = _one_at_a_time(target, golden, tmp_path / "whole", resume=True)
    parts = sorted(glob.glob(str(tmp_path / "whole" / "rows" / "step=*" / "rank=*" / "part.parquet")))
    assert len(parts) == RANKS * STEPS
    for p in parts[::2]:  # as if the run had stopped before these pairs
        os.remove(p)
    kept = {p: os.stat(p).st_mtime_ns for p in parts[1::2]}
    again = _one_at_a_time(target, golden, tmp_path / "whole", resume=True)
    assert all(os.stat(p).st_mtime_ns == t for p, t in kept.items())  # not compared again
    assert all(os.path.isfile(p) for p in parts)
    assert again.diagnosis == whole.diagnosis
    assert_same_outputs(_in_memory(target, golden, tmp_path / "kept"), again)


class _Planted:
    """A pickle that, when loaded, leaves a file behind: what a hostile part's summary would do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_resume_never_loads_a_summary_it_did_not_sign(tmp_path, in_workers, monkeypatch):
    """A part whose summary was swapped for another pickle (its signature left as it was) is compared
    again on --resume, and the pickle is never loaded."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pickle
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    target = write_dumps(tmp_path / "t", True)
    golden = write_dumps(tmp_path / "g", False)
    whole = _one_at_a_time(target, golden, tmp_path / "out", resume=True)
    key = tmp_path / "cache" / "msprobe" / "resume.key"
    assert key.is_file() and (key.stat().st_mode & 0o777) == 0o600
    part = sorted(glob.glob(str(tmp_path / "out" / "rows" / "step=*" / "rank=*" / "part.parquet")))[0]
    table = pq.read_table(part)
    meta = dict(table.schema.metadata)
    landed = tmp_path / "ran"
    meta[b"msprobe.pair"] = pickle.dumps(_Planted(str(landed)))
    pq.write_table(table.replace_schema_metadata(meta), part)
    before = os.stat(part).st_mtime_ns
    again = _one_at_a_time(target, golden, tmp_path / "out", resume=True)
    assert not landed.exists()
    assert os.stat(part).st_mtime_ns != before  # compared again and written anew
    assert again.diagnosis == whole.diagnosis


def test_resume_of_other_inputs_is_refused(tmp_path, in_workers):
    pytest.importorskip("pyarrow")
    from msprobe.core.errors import MsprobeError
    target = write_dumps(tmp_path / "t", True)
    golden = write_dumps(tmp_path / "g", False)
    _one_at_a_time(target, golden, tmp_path / "out", resume=True)
    with pytest.raises(MsprobeError, match="--resume: .* other dumps or options"):
        _one_at_a_time(golden, target, tmp_path / "out", resume=True)


def test_a_bad_engine_in_compare_json_is_one_line(tmp_path):
    import subprocess
    import sys
    target = write_dumps(tmp_path / "t", False)
    cfg = tmp_path / "compare.json"
    cfg.write_text(json.dumps({"npu_path": target, "bench_path": target, "engine": "spark"}))
    run = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "compare", "-i", str(cfg), "-o",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert run.returncode == 1 and len(lines) == 1 and "engine" in lines[0] and "spark" in lines[0], run.stderr
    assert "pool, ray" in lines[0]


def test_the_driver_holds_each_pairs_trimmed_suspects_slim_and_shared(tmp_path, in_workers):
    """Every rank's target drifts from PLANT_CALL on, so every pair has dozens of suspects: the driver
    keeps the trimmed ones as slotted SlimSuspects sharing one Call per call over all pairs (a thousand
    pairs held them as dataclasses, half a gigabyte), and diagnoses as when every pair stays whole."""
    from msprobe.core.compare.engine import compare_plan
    from msprobe.core.compare.engines.summary import SlimSuspect
    target, golden = write_dumps(tmp_path / "t", False), write_dumps(tmp_path / "g", False)
    for step in range(STEPS):  # the target's every rank drifts from PLANT_CALL on
        for rank in range(RANKS):
            path = os.path.join(target, f"step{step}", f"rank{rank}", "dump.json")
            with open(path, "rb") as f:
                doc = orjson.loads(f.read())
            for i, rec in enumerate(doc["data"].values()):
                if i >= PLANT_CALL:
                    rec["output"][0]["Max"] *= 1.05
                    rec["output"][0]["Norm"] *= 1.05
            with open(path, "wb") as f:
                f.write(orjson.dumps(doc))
    plan = compare_plan(target, golden, progress=False)
    _, entries, *_ = rank_pairs.compare_and_label(plan, str(tmp_path / "out"), keep_tables=False, progress=False,
                                                  timestamp="20260101000000")
    slim = [s for e in entries for s in e.suspects if isinstance(s, SlimSuspect)]
    assert len(slim) >= RANKS * STEPS * 5, len(slim)  # past the MAX_SUSPECTS each pair keeps whole
    assert all(s.__slots__ and not hasattr(s, "__dict__") for s in slim)
    calls = {}
    for s in slim:
        assert calls.setdefault((s.call.key, s.call.order), s.call) is s.call  # one Call over all pairs
    assert len(calls) < len(slim) / (RANKS * STEPS) * 2
    kept = _in_memory(target, golden, tmp_path / "kept")
    streamed = _one_at_a_time(target, golden, tmp_path / "streamed")
    assert streamed.diagnosis["suspect_count"] > 10
    assert_same_outputs(kept, streamed)


def test_many_pairs_keep_no_suspects_rows_on_the_pool_either(tmp_path, in_workers, monkeypatch):
    """From LEAN_MIN_PAIRS pairs on, the pool's driver too holds every suspect slim; the listed ones
    are read again, and the diagnosis is the one of whole pairs."""
    from msprobe.core.compare.engine import compare_plan
    from msprobe.core.compare.engines.summary import SlimSuspect
    monkeypatch.setattr(rank_pairs, "LEAN_MIN_PAIRS", RANKS * STEPS)
    target, golden = write_dumps(tmp_path / "t", True), write_dumps(tmp_path / "g", False)
    _, entries, *_ = rank_pairs.compare_and_label(compare_plan(target, golden, progress=False),
                                                  str(tmp_path / "out"), keep_tables=False, progress=False,
                                                  timestamp="20260101000000")
    suspects = [s for e in entries for s in e.suspects]
    assert suspects and all(isinstance(s, SlimSuspect) for s in suspects)
    streamed = _one_at_a_time(target, golden, tmp_path / "streamed")
    assert streamed.diagnosis["suspects"][0]["inputs"]  # read again: evidence, not an empty shell
    assert_same_outputs(_in_memory(target, golden, tmp_path / "kept"), streamed)

"""`--resume` over parts an older msprobe wrote: each such part is named once in one line and its pair is
compared again; nothing of it is loaded, and the outputs are those of an uninterrupted run."""

import glob
import hashlib
import hmac
import logging
import os
import shutil

import orjson
import pytest

from msprobe.core.compare import write_compare

HERE = os.path.dirname(os.path.abspath(__file__))
# a part `write_compare(..., resume=True)` of msprobe before its typed diagnosis wrote for step 0 rank 1 of
# `write_dumps(..., planted=True)` (its summary a PairDone holding a dict entry, classes of
# msprobe.core.diagnosis.suspects, which no longer exists)
OLD_PART = os.path.join(HERE, "data", "part_before_typed_diagnosis.parquet")
RANKS, CALLS = 2, 12


def _tensor(value):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 16], "Max": value, "Min": -value,
            "Mean": value / 10, "Norm": value * 3, "requires_grad": True}


def write_dumps(root, planted):
    """One step, RANKS ranks of CALLS calls; with `planted`, rank 1's outputs drift from call 6 on."""
    for rank in range(RANKS):
        data = {}
        for i in range(CALLS):
            drift = 1.05 if planted and rank == 1 and i >= 6 else 1.0
            x = 1.0 + i / 7
            data[f"Functional.linear.{i}.forward"] = {"input_args": [_tensor(x), _tensor(x / 2)], "input_kwargs": {},
                                                      "output": [_tensor((x + 0.5) * drift)]}
        d = os.path.join(root, "step0", f"rank{rank}")
        os.makedirs(d)
        doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}
        with open(os.path.join(d, "dump.json"), "wb") as f:
            f.write(orjson.dumps(doc))
    return str(root)


def _compare(target, golden, out, **kwargs):
    return write_compare(target, golden, str(out), progress=False, keep_tables=False,
                         timestamp="20260101000000", **kwargs)


def _files(folder):
    out = {}
    for p in sorted(glob.glob(os.path.join(folder, "*"))):
        if os.path.isfile(p):
            with open(p, "rb") as f:
                out[os.path.basename(p)] = f.read()
    return out


def _signed_by_this_user(path):
    """The old part as this user's own earlier run left it: its summary signed with this user's key (the
    fixture was signed with another's), the rest as the older msprobe wrote it."""
    import pyarrow.parquet as pq
    from msprobe.core.compare.parts import signing_key
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)
    blob = meta[b"msprobe.pair"]
    meta[b"msprobe.pair.hmac"] = hmac.new(signing_key(), blob, hashlib.sha256).hexdigest().encode()
    pq.write_table(table.replace_schema_metadata(meta), path)


@pytest.fixture
def own_key(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_resume_compares_a_part_of_an_older_msprobe_again_and_says_so(tmp_path, own_key, caplog):
    pytest.importorskip("pyarrow")
    target = write_dumps(tmp_path / "t", True)
    golden = write_dumps(tmp_path / "g", False)
    whole = _compare(target, golden, tmp_path / "whole")
    out = tmp_path / "out"
    _compare(target, golden, out, resume=True)
    parts = sorted(glob.glob(str(out / "rows" / "step=0" / "rank=*" / "part.parquet")))
    assert len(parts) == RANKS
    shutil.copy(OLD_PART, parts[1])  # rank 1's part from before the upgrade
    _signed_by_this_user(parts[1])
    kept = os.stat(parts[0]).st_mtime_ns
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        again = _compare(target, golden, out, resume=True)
    said = [r.getMessage() for r in caplog.records if "--resume" in r.getMessage()]
    assert len(said) == 1, said
    assert "step=0/rank=1/part.parquet" in said[0] and "again" in said[0], said[0]
    assert "\n" not in said[0]
    assert os.stat(parts[0]).st_mtime_ns == kept  # the current part was taken as it is
    assert again.diagnosis.to_json() == whole.diagnosis.to_json()
    assert again.diagnosis.suspects and again.diagnosis.suspects[0].ranks == [1]
    assert _files(out) == _files(tmp_path / "whole")
    # the part written anew is read on the next resume, without a word
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        _compare(target, golden, out, resume=True)
    assert not [r for r in caplog.records if "--resume" in r.getMessage()]


def test_resume_says_so_for_a_part_signed_by_someone_else(tmp_path, own_key, caplog):
    """A part of the current layout whose summary this user's key did not sign (another user's, or
    changed): compared again, said in one line."""
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    target = write_dumps(tmp_path / "t", True)
    golden = write_dumps(tmp_path / "g", False)
    out = tmp_path / "out"
    whole = _compare(target, golden, out, resume=True)
    part = sorted(glob.glob(str(out / "rows" / "step=0" / "rank=*" / "part.parquet")))[0]
    table = pq.read_table(part)
    meta = dict(table.schema.metadata)
    meta[b"msprobe.pair.hmac"] = b"0" * 64
    pq.write_table(table.replace_schema_metadata(meta), part)
    with caplog.at_level(logging.WARNING, logger="msprobe"):
        again = _compare(target, golden, out, resume=True)
    said = [r.getMessage() for r in caplog.records if "--resume" in r.getMessage()]
    assert len(said) == 1 and "step=0/rank=0/part.parquet" in said[0], said
    assert again.diagnosis.to_json() == whole.diagnosis.to_json()

"""md5 compare between checksums of different hashes: a msProbe dump (CRC-32, 8 hex digits) against one
of ours (wordsum64, 16 hex digits) is said once, then compared on the statistics both dumps hold."""

import json
import logging
import os
import shutil

from msprobe.core.checksum import checksum_hex, checksum_kind
from msprobe.core.compare import compare_dumps

SAMPLE = os.path.join(os.path.dirname(__file__), "..", "data", "msprobe-samples", "pt_dump", "mlp_statistics_L1_md5")


def _as_wordsum(path):
    """The sample's records with each CRC-32 replaced by a wordsum64 value: what our dump of the same run
    holds (the statistics are the same numbers, the checksums another hash)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    doc = json.loads(text.replace("NaN", '"nan"').replace("-Infinity", '"-inf"').replace("Infinity", '"inf"'))

    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "md5" and isinstance(x, str):
                    v[k] = checksum_hex(x.encode())
                else:
                    walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(doc["data"])
    return doc


def test_crc32_against_wordsum64_is_said_once_and_compared_on_statistics(tmp_path, caplog):
    target = tmp_path / "target" / "step0" / "rank0"
    golden = tmp_path / "golden" / "step0" / "rank0"
    for d in (target, golden):
        shutil.copytree(SAMPLE, d)
    doc = _as_wordsum(golden / "dump.json")
    with open(golden / "dump.json", "w", encoding="utf-8") as f:
        json.dump(doc, f)
    one = next(r for r in doc["data"].values() if isinstance(r, dict) and r.get("input_args"))["input_args"][0]
    assert checksum_kind(one["md5"]) == "wordsum64"
    # two steps: two rank pairs, one compare, one message
    shutil.copytree(tmp_path / "target" / "step0", tmp_path / "target" / "step1")
    shutil.copytree(tmp_path / "golden" / "step0", tmp_path / "golden" / "step1")
    with caplog.at_level(logging.WARNING):
        results = compare_dumps(str(tmp_path / "target"), str(tmp_path / "golden"), progress=False)
    assert len(results) == 2
    res = results[0]
    assert res.mode == "statistics"
    assert set(res.table["Result"]) == {"pass"}, res.table[res.table["Result"] != "pass"]
    said = [r.getMessage() for r in caplog.records if "different hashes" in r.getMessage()]
    assert len(said) == 1 and "CRC-32" in said[0] and "wordsum64" in said[0]


def test_same_hash_on_both_sides_stays_md5_mode(tmp_path):
    for side in ("target", "golden"):
        shutil.copytree(SAMPLE, tmp_path / side / "step0" / "rank0")
    (res,) = compare_dumps(str(tmp_path / "target"), str(tmp_path / "golden"), progress=False)
    assert res.mode == "md5" and set(res.table["Result"]) == {"pass"}

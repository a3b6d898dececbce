"""md5 compare: our md5 dump holds msProbe's CRC-32 for every tensor, so a msProbe md5 dump and ours
compare row by row in md5 mode; against checksums of another hash (a dump of msprobe from before it wrote
CRC-32: 16 hex digits) the difference is said once, then the statistics both dumps hold are compared."""

import hashlib
import json
import logging
import os
import shutil
import zlib

from compare_fixtures import SAMPLES
from msprobe.core.checksum import OLDER64, checksum_kind
from msprobe.core.compare import compare_dumps
from msprobe.core.dump.reader import DumpReader, find_rank_dirs, iter_tensor_records
from msprobe.core.dump.tensor_files import load_tensor_file

SAMPLE = os.path.join(SAMPLES, "pt_dump", "mlp_statistics_L1_md5")


def _as_older64(path):
    """The sample's records with each CRC-32 replaced by a 16-digit value: what msprobe's dump of the same
    run held before it wrote CRC-32 (the statistics are the same numbers, the checksums another hash)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    doc = json.loads(text.replace("NaN", '"nan"').replace("-Infinity", '"-inf"').replace("Infinity", '"inf"'))

    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "md5" and isinstance(x, str):
                    v[k] = hashlib.blake2b(x.encode(), digest_size=8).hexdigest()
                else:
                    walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(doc["data"])
    return doc


def test_crc32_against_an_older_64_bit_checksum_is_said_once_and_compared_on_statistics(tmp_path, caplog):
    target = tmp_path / "target" / "step0" / "rank0"
    golden = tmp_path / "golden" / "step0" / "rank0"
    for d in (target, golden):
        shutil.copytree(SAMPLE, d)
    doc = _as_older64(golden / "dump.json")
    with open(golden / "dump.json", "w", encoding="utf-8") as f:
        json.dump(doc, f)
    one = next(r for r in doc["data"].values() if isinstance(r, dict) and r.get("input_args"))["input_args"][0]
    assert checksum_kind(one["md5"]) == OLDER64
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
    assert len(said) == 1 and "CRC-32" in said[0] and OLDER64 in said[0]


def test_same_hash_on_both_sides_stays_md5_mode(tmp_path):
    for side in ("target", "golden"):
        shutil.copytree(SAMPLE, tmp_path / side / "step0" / "rank0")
    (res,) = compare_dumps(str(tmp_path / "target"), str(tmp_path / "golden"), progress=False)
    assert res.mode == "md5" and set(res.table["Result"]) == {"pass"}


def _records(dump_root):
    (rank,) = find_rank_dirs(dump_root)
    return rank.path, DumpReader(rank.path)


def test_our_md5_dump_holds_msprobes_crc32_and_compares_row_by_row(dumps, tmp_path):
    """The same training step dumped with md5 and as tensors: each md5 is zlib's CRC-32 of the saved tensor's
    bytes (what msProbe writes for it); a dump holding those values (msProbe's) compares in md5 mode, every
    row a pass, and a changed tensor is the one error."""
    ours_dir, ours = _records(dumps("fp32", "md5"))
    tensor_dir, tensors = _records(dumps("fp32", "tensor"))
    assert list(ours.keys()) == list(tensors.keys())
    golden = tmp_path / "msprobe" / "step0" / "rank0"
    shutil.copytree(ours_dir, golden)
    with open(golden / "dump.json", encoding="utf-8") as f:
        doc = json.load(f)
    n = 0
    for key in ours.keys():
        mine = dict(iter_tensor_records(ours[key]))
        for path, rec in iter_tensor_records(tensors[key]):
            arr = load_tensor_file(os.path.join(tensor_dir, "dump_tensor_data", rec["data_name"])).array
            want = f"{zlib.crc32(arr.tobytes()):08x}"
            assert mine[path]["md5"] == want, (key, path)
            node = doc["data"][key]
            for part in path:
                node = node[part]
            node["md5"] = want  # msProbe's dump of the step: its checksums, computed here by zlib
            n += 1
    assert n > 40
    with open(golden / "dump.json", "w", encoding="utf-8") as f:
        json.dump(doc, f)
    ours_root = tmp_path / "ours" / "step0" / "rank0"
    shutil.copytree(ours_dir, ours_root)
    (res,) = compare_dumps(str(tmp_path / "ours"), str(tmp_path / "msprobe"), progress=False)
    assert res.mode == "md5" and len(res.table) >= n and set(res.table["Result"]) == {"pass"}
    # one tensor's bytes differ on msProbe's side: that row, and only it, is an error
    first = next(k for k in ours.keys() if list(iter_tensor_records(doc["data"][k])))
    _, rec = next(iter_tensor_records(doc["data"][first]))
    rec["md5"] = f"{int(rec['md5'], 16) ^ 1:08x}"
    with open(golden / "dump.json", "w", encoding="utf-8") as f:
        json.dump(doc, f)
    (res,) = compare_dumps(str(tmp_path / "ours"), str(tmp_path / "msprobe"), progress=False)
    assert (res.table["Result"] == "error").sum() == 1

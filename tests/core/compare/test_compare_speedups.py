"""The fast paths of a big compare give exactly what the plain Python ones gave."""
import gc
import json
import math

import numpy as np

from msprobe.core.compare.float_text import float_reprs
from msprobe.core.compare.writer import write_csv
from msprobe.core.dump.reader import load_json


def test_float_reprs_match_repr_on_every_magnitude_and_bit_pattern():
    rng = np.random.default_rng(0)
    values = np.concatenate([
        rng.random(20000) * 100,
        rng.standard_normal(20000) * 10.0 ** rng.integers(-30, 30, 20000),
        rng.integers(-2 ** 62, 2 ** 62, 20000).view(np.float64),  # arbitrary bit patterns
        [1e16, 1e16 - 2, 9999999999999998.0, 1e15, 1e-4, 9.99999999999999e-5, 1e-5, 5e-324, -0.0, 0.0,
         1.7976931348623157e308, 0.1, 1 / 3, 123456789012345678.0],
    ])
    values = values[np.isfinite(values)]
    assert float_reprs(values) == [repr(v) for v in values.tolist()]
    assert float_reprs(values, "%") == [repr(v) + "%" for v in values.tolist()]  # the x% cells
    assert float_reprs(np.array([])) == []


def test_csv_cells_are_the_str_of_each_value(tmp_path):
    import csv

    import pandas as pd
    cells = [0.1, 1e-7, 2.5e16, -0.0, None, math.nan, math.inf, "N/A", True, 3, "12.5%"]
    table = pd.DataFrame({"Max diff": pd.Series(cells, dtype=object), "Result": ["pass"] * len(cells)})
    path = write_csv(table, str(tmp_path / "t.csv"))
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    assert [r[0] for r in rows] == ["0.1", "1e-07", "2.5e+16", "-0.0", "None", "nan", " inf", "N/A", "True", "3",
                                    "12.5%"]


def test_load_json_reads_msprobe_bare_nan_tokens(tmp_path):
    # orjson refuses NaN/Infinity tokens; msProbe writes them, so the standard parser takes over
    p = tmp_path / "dump.json"
    p.write_text('{"data": {"a": {"Max": NaN, "Min": -Infinity, "Mean": 1.5}}}')
    rec = load_json(str(p))["data"]["a"]
    assert math.isnan(rec["Max"]) and rec["Min"] == -math.inf and rec["Mean"] == 1.5
    p.write_text(json.dumps({"data": {"b": [1, 2 ** 70]}}))  # beyond 64-bit integers, too
    assert load_json(str(p))["data"]["b"] == [1, 2 ** 70]


def test_csv_text_is_what_csv_writer_writes(tmp_path):
    # the csv is joined by hand for speed: quoting, line ends and every cell type as csv.writer has them
    import csv

    import pandas as pd

    from msprobe.core.compare.writer import _rendered_columns
    mixed = [0.1, "a,b", 'say "hi"', "two\nlines", "cr\rhere", "", " inf", "inf", math.inf, -math.inf, math.nan,
             None, np.float64(0.25), np.float64(math.inf), pd.NA, 7, False, [1, 2], "[4, 64, 256]", 1e-05]
    n = len(mixed)
    table = pd.DataFrame({"NPU Name": pd.Series(mixed, dtype=object),        # a text column
                          "Max diff": pd.Series(mixed[::-1], dtype=object),  # a value column
                          "NPU max": pd.Series(np.linspace(-1e-5, 1e17, n), dtype=object),
                          "Result": ["pass"] * n})
    path = write_csv(table, str(tmp_path / "t.csv"))
    expected = tmp_path / "expected.csv"
    with open(expected, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(list(table.columns))
        w.writerows(zip(*_rendered_columns(table)))
    with open(path, "rb") as a, open(expected, "rb") as b:
        assert a.read() == b.read()


def test_golden_rows_read_in_a_worker_give_the_same_table(tmp_path, monkeypatch):
    # big dumps are read in two processes and the golden rows packed for the trip back: force that
    # path on a small pair holding every kind of row, and compare with reading both in this process
    from compare_fixtures import tensor, write_dump

    from msprobe.core.compare import engine
    data = {
        "Functional.linear.0.forward": {
            "input_args": [tensor(0.5, -0.5, 0.01, 3.0), {"type": "int", "value": 3}, None,
                           [tensor(2, 1, 1.5, 4), {"type": "slice", "value": [1, None, 2]}]],
            "input_kwargs": {"dim": {"type": "int", "value": -1}, "alpha": tensor("inf", "-inf", "nan", None)},
            "output": [tensor(1e-07, -2.5e16, 0.0, 7.25, rg=None)]},
        "Tensor.__add__.0.backward": {"input": [tensor(True, False, 0.5, 1.0)], "output": [tensor(math.nan)]},
    }
    golden = json.loads(json.dumps(data).replace("0.5", "0.625"))
    t = write_dump(tmp_path / "t", data)
    g = write_dump(tmp_path / "g", golden)
    serial = engine.compare_dumps(t, g, progress=False)[0].table
    monkeypatch.setattr(engine, "PARALLEL_LOAD_BYTES", 0)
    parallel = engine.compare_dumps(t, g, progress=False)[0].table
    assert list(parallel.dtypes) == list(serial.dtypes)
    for column in serial.columns:
        assert [repr(v) for v in parallel[column]] == [repr(v) for v in serial[column]], column


def test_row_table_float_copies_and_fused_flags_follow_each_value():
    # the float copies of the statistics are made column-wise: numbers (bool and int included) as
    # floats, absent values and text (a str scalar, even one that reads as a number) as NaN
    from compare_fixtures import tensor

    from msprobe.core.compare.rows import frame_from_records
    data = {"Functional.f.0.forward": {
        "input_args": [tensor(True, 3, None, 2.5), {"type": "str", "value": "1.5"},
                       tensor(None, fused_away=True), tensor(1.0, fused_away=False)],
        "input_kwargs": {}, "output": [tensor("inf", "-inf", "nan", 1)]}}
    frame = frame_from_records(data)
    got = frame[["fmax", "fmin", "fmean", "fnorm"]].to_numpy()
    expected = np.array([[1.0, 3.0, np.nan, 2.5], [np.nan] * 4, [np.nan] * 4, [1.0] * 4,
                         [np.inf, -np.inf, np.nan, 1.0]])
    np.testing.assert_array_equal(got, expected)
    assert frame["max"].tolist()[:2] == [True, "1.5"] and frame["mean"][4] != frame["mean"][4]  # NaN kept
    assert frame["fused"].dtype == bool and frame["fused"].tolist() == [False, False, True, False, False]
    # shapes, dtypes and suffixes are shared strings, built once per distinct value
    assert frame["shape"][0] is frame["shape"][3] and frame["suffix"][0] == ".input.0"


def test_diagnosis_builds_and_ranks_its_rows_with_the_collector_paused(tmp_path, monkeypatch):
    # a big pair's diagnosis holds a Row per compared value: every collection while they are alive
    # walked them all; both the per-pair work and the ranking over pairs run paused, and it comes back
    from compare_fixtures import tensor, write_dump

    from msprobe.core.compare.engine import compare_dumps
    from msprobe.core.diagnosis import combine, pair, ranking
    data = {f"Functional.linear.{i}.forward": {"input_args": [tensor(1.0 + i)], "input_kwargs": {},
                                                "output": [tensor(2.0 + i)]} for i in range(3)}
    golden = {k: {**v, "output": [tensor(3.0)]} for k, v in data.items()}
    results = compare_dumps(write_dump(tmp_path / "t", data), write_dump(tmp_path / "g", golden), progress=False)
    seen = []
    for module, name in ((pair, "calls_from_rows"), (combine, "rank_suspects")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, **k: (seen.append(gc.isenabled()), _f(*a, **k))[1])
    d = combine.diagnose(results)
    assert d["divergence"] and seen == [False, False] and gc.isenabled()

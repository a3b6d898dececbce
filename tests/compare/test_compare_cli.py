"""`msprobe compare` as a user runs it: the installed console script, every input form, csv/xlsx output,
the diagnosis hand-off, exit codes and one-line errors."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from compare_fixtures import tensor, write_dump


def msprobe(*args, cwd=None):
    exe = shutil.which("msprobe") or sys.executable
    cmd = [exe, *args] if exe != sys.executable else [exe, "-m", "msprobe.cli.main", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)


def _one_line_error(proc, *needles):
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_help_is_fast_to_import():
    code = ("import sys\nfrom msprobe.cli.main import main\ntry:\n    main(['compare', '-h'])\n"
            "except SystemExit:\n    pass\nprint(sorted(m for m in ('pandas', 'numpy', 'torch', 'openpyxl') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "--target_path" in out.stdout and "--layer_mapping" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_compare_json_form_with_framework_flag_and_layer_mapping(dumps, runs, tmp_path):
    target, golden = dumps("softmax_bf16", "statistics"), dumps("fp32", "statistics")
    cfg = tmp_path / "compare.json"
    cfg.write_text(json.dumps({"npu_path": runs.dump_json(target), "bench_path": runs.dump_json(golden),
                               "stack_path": os.path.join(runs.rank_dir(target), "stack.json"),
                               "is_print_compare_log": True}))
    lm = tmp_path / "layer_mapping.yaml"
    lm.write_text("TopLayer:\n  ln: ln\n")
    out = tmp_path / "out"
    proc = msprobe("-f", "mindspore", "compare", "-i", str(cfg), "-o", str(out), "-lm", str(lm))
    assert proc.returncode == 0, proc.stderr
    (csv,) = glob.glob(str(out / "compare_result_*.csv"))
    assert re.fullmatch(r"compare_result_\d{14}\.csv", os.path.basename(csv))
    table = pd.read_csv(csv, dtype=str, keep_default_na=False)
    assert table.columns[-1] == "NPU_Stack_Info" and table["NPU_Stack_Info"].str.contains("runs.py").any()
    assert "[error] Functional.softmax.0.forward.input.0: error: target and golden dtypes differ" in proc.stdout
    diagnosis = json.loads((out / "diagnosis.json").read_text())
    assert diagnosis["divergence"] is True
    assert "softmax" in proc.stdout.lower()


def test_rank_dirs_step_dirs_and_roots_name_their_result_files(dumps, runs, tmp_path):
    target, golden = dumps("perturbed", "statistics", steps=2), dumps("fp32", "statistics", steps=2)
    out = tmp_path / "roots"
    proc = msprobe("compare", "-tp", target, "-gp", golden, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    names = sorted(os.path.basename(p) for p in glob.glob(str(out / "compare_result_*.csv")))
    assert [re.sub(r"_\d{14}", "", n) for n in names] == ["compare_result_step0_rank0.csv",
                                                          "compare_result_step1_rank0.csv"]
    assert (out / "diagnosis.json").is_file()
    out2 = tmp_path / "ranks"
    proc = msprobe("compare", "-tp", runs.rank_dir(target, 1), "-gp", runs.rank_dir(golden, 1), "-o", str(out2))
    assert proc.returncode == 0, proc.stderr
    (name,) = [os.path.basename(p) for p in glob.glob(str(out2 / "*.csv"))]
    assert re.fullmatch(r"compare_result_rank0_\d{14}\.csv", name)
    assert "step 1 rank 0: statistics compare" in proc.stdout


def test_fail_on_divergence_exit_codes(dumps, tmp_path):
    same = msprobe("compare", "-tp", dumps("fp32", "statistics"), "-gp", dumps("fp32", "statistics"),
                   "-o", str(tmp_path / "a"), "--fail-on-divergence")
    assert same.returncode == 0, same.stderr
    differs = msprobe("compare", "-tp", dumps("softmax_bf16", "statistics"), "-gp", dumps("fp32", "statistics"),
                      "-o", str(tmp_path / "b"), "--fail-on-divergence")
    assert differs.returncode == 2, differs.stderr


def test_xlsx_highlights_error_and_warning_cells(dumps, tmp_path):
    from openpyxl import load_workbook
    out = tmp_path / "x"
    proc = msprobe("compare", "-tp", dumps("softmax_bf16", "tensor"), "-gp", dumps("fp32", "tensor"),
                   "-o", str(out), "--xlsx", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    (path,) = glob.glob(str(out / "compare_result_rank0_*.xlsx"))
    ws = load_workbook(path).active
    header = [c.value for c in ws[1]]
    col = {name: i for i, name in enumerate(header)}
    assert header.index("Diagnosis") == header.index("Err_message") + 1
    seen, labels = set(), set()
    for row in ws.iter_rows(min_row=2):
        result = row[col["Result"]].value
        fill = row[col["Result"]].fill.fgColor.rgb
        if result == "error":
            assert fill.endswith("FFC7CE")
            if "dtypes differ" in row[col["Err_message"]].value:
                assert row[col["NPU Dtype"]].fill.fgColor.rgb.endswith("FFC7CE")
                assert row[col["NPU Name"]].fill.fgColor.rgb in (None, "00000000")
        elif result == "warning":
            assert fill.endswith("FFEB9C")
        else:
            assert fill in (None, "00000000")
        seen.add(result)
        label = row[col["Diagnosis"]]
        expected = {"introduces": "FFC7CE", "marginal": "FFEB9C", "inherits": "FCE4D6"}.get(label.value)
        if expected:
            assert label.fill.fgColor.rgb.endswith(expected), label.value
        else:
            assert label.fill.fgColor.rgb in (None, "00000000")
        labels.add(label.value)
    assert {"pass", "error"} <= seen
    assert {"introduces", "inherits", "agrees"} <= labels  # one story: where error enters is marked


def test_the_same_xlsx_compare_writes_the_same_bytes(dumps, tmp_path):
    """An xlsx's zip entries and created/modified properties carry the compare's timestamp (the one in
    its name), not the clock: two compares seconds apart (zip times have 2 s steps) write equal bytes."""
    import time
    import zipfile
    from openpyxl import load_workbook
    from msprobe.core.compare import write_compare
    paths = []
    for run in ("a", "b"):
        if paths:
            time.sleep(2.1)
        write_compare(dumps("softmax_bf16", "tensor"), dumps("fp32", "tensor"), str(tmp_path / run), xlsx=True,
                      progress=False, timestamp="20260102030405")
        (path,) = glob.glob(str(tmp_path / run / "compare_result_rank0_20260102030405.xlsx"))
        paths.append(path)
    with open(paths[0], "rb") as a, open(paths[1], "rb") as b:
        assert a.read() == b.read()
    with zipfile.ZipFile(paths[0]) as z:
        assert {i.date_time for i in z.infolist()} == {(2026, 1, 2, 3, 4, 4)}
    props = load_workbook(paths[0]).properties
    assert str(props.created) == str(props.modified) == "2026-01-02 03:04:05"


def test_csv_writes_infinity_with_a_leading_space_and_none(tmp_path):
    data = {"Functional.f.0.forward": {"input_args": [tensor("inf", mn=0.0, mean=None)], "input_kwargs": {},
                                       "output": [tensor(1.0)]}}
    t = write_dump(tmp_path / "t", data)
    g = write_dump(tmp_path / "g", data)
    proc = msprobe("compare", "-tp", t, "-gp", g, "-o", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    (csv,) = glob.glob(str(tmp_path / "o" / "*.csv"))
    text = open(csv).read()
    first = text.splitlines()[1].split(",")
    assert " inf" in first and "None" in first


def test_missing_tensor_file_is_a_row_message(dumps, tmp_path):
    target = tmp_path / "t"
    shutil.copytree(dumps("perturbed", "tensor"), target)
    victim = glob.glob(str(target / "step0" / "rank0" / "dump_tensor_data" / "Functional.gelu.0.forward.output.0.npy"))
    os.remove(victim[0])
    from msprobe.core.compare import compare_dumps
    (res,) = compare_dumps(str(target), dumps("fp32", "tensor"), progress=False)
    row = res.table.set_index("NPU Name").loc["Functional.gelu.0.forward.output.0"]
    assert "tensor file unreadable" in row["Err_message"] and "Functional.gelu.0.forward.output.0.npy" in row["Err_message"]
    assert row["Cosine"] == "N/A"


@pytest.mark.parametrize("case", ["truncated", "missing", "unknown_field", "bad_json", "no_inputs", "dm_fm",
                                  "bad_yaml", "not_a_dump"])
def test_bad_input_is_one_line(case, dumps, runs, tmp_path):
    golden = dumps("fp32", "statistics")
    if case == "truncated":
        bad = tmp_path / "step0" / "rank0"
        bad.mkdir(parents=True)
        text = open(runs.dump_json(golden)).read()
        (bad / "dump.json").write_text(text[: len(text) // 2])
        _one_line_error(msprobe("compare", "-tp", str(tmp_path), "-gp", golden, "-o", str(tmp_path / "o")),
                        str(bad / "dump.json"), "truncated")
    elif case == "missing":
        _one_line_error(msprobe("compare", "-tp", str(tmp_path / "nope"), "-gp", golden), "nope", "does not exist")
    elif case == "unknown_field":
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps({"npu_path": golden, "bench_path": golden, "npu_dir": "x"}))
        _one_line_error(msprobe("compare", "-i", str(cfg)), "npu_dir", "allowed")
    elif case == "bad_json":
        cfg = tmp_path / "c.json"
        cfg.write_text('{"npu_path": ')
        _one_line_error(msprobe("compare", "-i", str(cfg)), str(cfg), "not valid JSON")
    elif case == "no_inputs":
        _one_line_error(msprobe("compare", "-tp", golden), "-gp")
    elif case == "dm_fm":
        dm = tmp_path / "dm.yaml"
        dm.write_text("a: b\n")
        _one_line_error(msprobe("compare", "-tp", runs.dump_json(golden), "-gp", runs.dump_json(golden),
                                "-dm", str(dm), "-fm", "-o", str(tmp_path / "o")), "cannot be combined")
    elif case == "bad_yaml":
        lm = tmp_path / "lm.yaml"
        lm.write_text("TopLayer: [unclosed\n")
        _one_line_error(msprobe("compare", "-tp", golden, "-gp", golden, "-lm", str(lm), "-o", str(tmp_path / "o")),
                        "layer mapping", str(lm))
    elif case == "not_a_dump":
        _one_line_error(msprobe("compare", "-tp", str(tmp_path), "-gp", golden), "no dump found")


def test_debug_json_results_are_named_for_single_point_saves(tmp_path):
    from compare_fixtures import SAMPLES
    debug = os.path.join(SAMPLES, "pt_dump", "mlp_debug_level", "debug.json")
    proc = msprobe("compare", "-tp", debug, "-gp", debug, "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (name,) = [os.path.basename(p) for p in glob.glob(str(tmp_path / "*.csv"))]
    assert re.fullmatch(r"debug_compare_result_rank0_\d{14}\.csv", name)
    table = pd.read_csv(tmp_path / name, dtype=str, keep_default_na=False)
    assert len(table) == 4 and set(table["Result"]) == {"pass"}


def test_csv_written_by_two_processes_equals_the_serial_file(dumps, tmp_path, monkeypatch):
    from msprobe.core.compare import compare_dumps, writer
    (res,) = compare_dumps(dumps("perturbed", "statistics"), dumps("fp32", "statistics"), progress=False)
    writer._write_csv_rows(res.table, str(tmp_path / "serial.csv"), True)
    monkeypatch.setattr(writer, "PARALLEL_CSV_ROWS", 10)
    writer.write_csv(res.table, str(tmp_path / "parallel.csv"))
    assert (tmp_path / "serial.csv").read_bytes() == (tmp_path / "parallel.csv").read_bytes()
    assert not list(tmp_path.glob("*.part"))
    assert len(pd.read_csv(tmp_path / "parallel.csv")) == len(res.table)

"""Every reader is bounded and total: a FIFO where a file should be, JSON nested 100,000 deep, a
5000-digit integer, a file over the size limit, a stack.json or construct.json of the wrong JSON type
are each one line naming the file, from the Python API and from the command line, never a traceback or
a hang."""

import json
import os
import subprocess
import sys

import pytest

from msprobe.core.dump.reader import DumpReader, load_json, load_stack
from msprobe.core.errors import DumpFormatError, MsprobeError

TIMEOUT = 60  # a FIFO that is opened for reading would wait for a writer forever


def record(mx=1.0, **extra):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4], "Max": mx, "Min": mx, "Mean": mx,
            "Norm": mx, "requires_grad": False, **extra}


def rank_dir(root, data=None, step=0, task="statistics", level="mix"):
    d = os.path.join(str(root), f"step{step}", "rank0")
    os.makedirs(d, exist_ok=True)
    data = data if data is not None else {"Functional.relu.0.forward": {"input_args": [record()], "output": [record()]}}
    with open(os.path.join(d, "dump.json"), "w") as f:
        json.dump({"task": task, "level": level, "framework": "pytorch", "dump_data_dir": None, "data": data}, f)
    return d


def msprobe(*args, env=None):
    return subprocess.run([sys.executable, "-m", "msprobe.cli.main", *map(str, args)], capture_output=True,
                          text=True, timeout=TIMEOUT, env=None if env is None else dict(os.environ, **env))


def one_line(proc, *words):
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def test_fifos_are_refused_at_once(tmp_path):
    fifo = str(tmp_path / "dump.json")
    os.mkfifo(fifo)
    with pytest.raises(DumpFormatError, match="is a FIFO; expected a regular file"):
        DumpReader(fifo)
    with pytest.raises(DumpFormatError, match="is a FIFO"):
        load_stack(fifo)
    # the command line: compare.json, a stack_path inside it, and graph's compare.json
    t, g = rank_dir(tmp_path / "t"), rank_dir(tmp_path / "g")
    one_line(msprobe("compare", "-i", fifo, "-o", tmp_path / "out"), fifo, "FIFO")
    cfg = tmp_path / "compare.json"
    cfg.write_text(json.dumps({"npu_path": t, "bench_path": g, "stack_path": fifo}))
    one_line(msprobe("compare", "-i", cfg, "-o", tmp_path / "out"), "FIFO")
    one_line(msprobe("graph", "-i", fifo, "-o", tmp_path / "out"), "FIFO")


def test_a_fifo_as_a_tensor_file_is_an_unreadable_row(tmp_path):
    """Tensor mode: the row of a FIFO, a truncated file, a header that lies about its shape or a name
    outside the tensor folder is N/A with the reason; the other rows are compared."""
    np = pytest.importorskip("numpy")
    names = ["ok", "fifo", "short", "lying", "escape"]
    data = {f"Functional.{n}.0.forward": {"input_args": [], "output": [record(data_name=f"{n}.npy")]} for n in names}
    data["Functional.escape.0.forward"]["output"][0]["data_name"] = "../../../escape.npy"
    sides = {}
    for side in ("t", "g"):
        d = rank_dir(tmp_path / side, data, task="tensor")
        os.makedirs(os.path.join(d, "dump_tensor_data"))
        for n in names:
            np.save(os.path.join(d, "dump_tensor_data", f"{n}.npy"), np.ones(4, np.float32))
        sides[side] = d
    tensors = os.path.join(sides["t"], "dump_tensor_data")
    os.remove(os.path.join(tensors, "fifo.npy"))
    os.mkfifo(os.path.join(tensors, "fifo.npy"))
    raw = open(os.path.join(tensors, "ok.npy"), "rb").read()
    open(os.path.join(tensors, "short.npy"), "wb").write(raw[:-4])
    open(os.path.join(tensors, "lying.npy"), "wb").write(raw.replace(b"(4,)", b"(3,)"))
    proc = msprobe("compare", "-tp", sides["t"], "-gp", sides["g"], "-o", tmp_path / "out", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    import pandas as pd
    table = pd.read_csv(next((tmp_path / "out").glob("compare_result_*.csv")), keep_default_na=False).set_index(
        "NPU Name")
    assert table.loc["Functional.ok.0.forward.output.0", "Result"] == "pass"
    reasons = {"fifo": "is a FIFO", "short": "header says shape [4]", "lying": "header says shape [3]",
               "escape": "is not a file name"}
    for n, reason in reasons.items():
        row = table.loc[f"Functional.{n}.0.forward.output.0"]
        assert row["Result"] == "N/A" and row["Cosine"] == "N/A", (n, row["Result"])
        assert "tensor file unreadable" in row["Err_message"] and reason in row["Err_message"], row["Err_message"]


def test_deep_nesting_and_long_integers_are_one_line(tmp_path):
    deep = tmp_path / "deep" / "dump.json"
    deep.parent.mkdir()
    deep.write_text('{"data": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(DumpFormatError, match="nested deeper than 1024"):
        load_json(str(deep))
    digits = rank_dir(tmp_path / "digits")
    text = open(os.path.join(digits, "dump.json")).read().replace('"shape": [4]', '"shape": [' + "9" * 5000 + "]")
    open(os.path.join(digits, "dump.json"), "w").write(text)
    with pytest.raises(DumpFormatError, match="integer of 5,000 digits.*MSPROBE_MAX_INT_DIGITS"):
        DumpReader(digits)
    one_line(msprobe("summary", "-i", deep), "deep", "nested deeper")
    one_line(msprobe("summary", "-i", digits), "5,000 digits")
    # msProbe's bare NaN still reads (the fallback parser), a 20-digit integer too
    ok = tmp_path / "ok.json"
    ok.write_text('{"a": NaN, "b": 12345678901234567890123}')
    assert load_json(str(ok))["b"] == 12345678901234567890123


def test_size_limit_is_the_users_to_set(tmp_path):
    d = rank_dir(tmp_path)
    proc = msprobe("summary", "-i", d, env={"MSPROBE_MAX_JSON_BYTES": "100"})
    one_line(proc, "dump.json", "over the limit of 100", "MSPROBE_MAX_JSON_BYTES")
    assert msprobe("summary", "-i", d, env={"MSPROBE_MAX_JSON_BYTES": "100000"}).returncode == 0
    one_line(msprobe("summary", "-i", d, env={"MSPROBE_MAX_JSON_BYTES": "lots"}),
             "MSPROBE_MAX_JSON_BYTES='lots'", "positive integer")


def test_wrong_json_types_are_one_line(tmp_path):
    d = rank_dir(tmp_path / "t")
    g = rank_dir(tmp_path / "g")
    with open(os.path.join(d, "stack.json"), "w") as f:
        json.dump([["Functional.relu.0.forward"], ["a.py:1"]], f)
    with pytest.raises(DumpFormatError, match="stack.json: expected a JSON object"):
        DumpReader(d).stack
    one_line(msprobe("compare", "-tp", d, "-gp", g, "-o", tmp_path / "out", "--no-progress"), "stack.json")
    os.remove(os.path.join(d, "stack.json"))
    with open(os.path.join(d, "construct.json"), "w") as f:
        json.dump(["Module.a.forward.0"], f)
    with pytest.raises(DumpFormatError, match="construct.json: expected a JSON object"):
        DumpReader(d).construct
    one_line(msprobe("graph_visualize", "-tp", d, "-o", tmp_path / "graph", "--no-progress"), "construct.json")
    with pytest.raises(MsprobeError):
        load_json(str(tmp_path))  # a directory

"""A dump from someone else is only strings: acc_check runs what resolves to the framework's operators or
the user's own custom APIs, never a shell, the standard library or a serializer a dump.json or
api_sources.json names, and builds no input bigger than --max-elements. Each refusal is a SKIP row
saying why, and the other APIs are still checked."""

import csv
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def tensor(dtype, shape, framework="pytorch"):
    kind = "torch.Tensor" if framework == "pytorch" else "mindspore.Tensor"
    return {"type": kind, "dtype": dtype, "shape": shape, "Max": 1.0, "Min": -1.0, "Mean": 0.0, "Norm": 2.0,
            "requires_grad": False}


def text(value):
    return {"type": "str", "value": value}


def write_dump(rank_dir, framework, data, sources=None):
    os.makedirs(rank_dir)
    with open(os.path.join(rank_dir, "dump.json"), "w") as f:
        json.dump({"task": "statistics", "level": "L1", "framework": framework, "dump_data_dir": None,
                   "data": data}, f)
    if sources is not None:
        with open(os.path.join(rank_dir, "api_sources.json"), "w") as f:
            json.dump({"custom_apis": {}, "primitives": {}, **sources}, f)
    return os.path.join(rank_dir, "dump.json")


def acc_check(dump, out, env_path, *extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(env_path)] + sys.path))
    proc = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "acc_check", "-api_info", str(dump), "-o",
                           str(out), "--no_progress", *extra], capture_output=True, text=True, timeout=300,
                          env=env, cwd=str(env_path))
    assert proc.returncode == 0, proc.stderr
    with open(next(out.glob("accuracy_checking_result_*.csv")), encoding="utf-8-sig", newline="") as f:
        return {r["API Name"]: r for r in csv.DictReader(f)}, proc.stdout


def relu_record(framework="pytorch", dtype="torch.float32"):
    return {"input_args": [tensor(dtype, [4, 4], framework)], "input_kwargs": {},
            "output": [tensor(dtype, [4, 4], framework)]}


def test_pytorch_dump_naming_a_shell_a_serializer_and_a_huge_input(tmp_path):
    pytest.importorskip("torch")
    marker, victim = tmp_path / "shell_ran", tmp_path / "victim.txt"
    victim.write_text("original")
    # a module of the user's that imports os.system: found by its name, refused by what it is
    (tmp_path / "user_ops.py").write_text("from os import system\n")
    data = {
        "Evil.system.0.forward": {"input_args": [text(f"touch {marker}")], "input_kwargs": {}, "output": []},
        "Sneaky.system.0.forward": {"input_args": [text(f"touch {marker}")], "input_kwargs": {}, "output": []},
        "Torch.save.0.forward": {"input_args": [text("payload"), text(str(victim))], "input_kwargs": {},
                                 "output": []},
        "Aten.from_file.0.forward": {"input_args": [text(str(victim))], "input_kwargs": {}, "output": []},
        "Functional.relu.0.forward": relu_record(),
        "Torch.matmul.0.forward": {"input_args": [tensor("torch.float32", [100000, 100000]),
                                                  tensor("torch.float32", [100000, 1])],
                                   "input_kwargs": {}, "output": [tensor("torch.float32", [100000, 1])]},
    }
    dump = write_dump(str(tmp_path / "dump" / "step0" / "rank0"), "pytorch", data, {"custom_apis": {
        "Evil.system": {"module": "os", "attribute": "system"},
        "Sneaky.system": {"module": "user_ops", "attribute": "system"}}})
    rows, stdout = acc_check(dump, tmp_path / "out", tmp_path)
    assert not marker.exists() and victim.read_text() == "original"
    assert rows["Functional.relu.0"]["Forward Test Success"] == "pass"
    for name in ("Evil.system.0", "Sneaky.system.0", "Torch.save.0", "Aten.from_file.0", "Torch.matmul.0"):
        assert rows[name]["Forward Test Success"] == "SKIP", name
        assert rows[name]["Message"].startswith("refused: "), rows[name]["Message"]
        assert f"{name}: refused: " in stdout
    assert "module 'os'" in rows["Evil.system.0"]["Message"]
    assert "posix.system" in rows["Sneaky.system.0"]["Message"]
    assert "[100000, 100000]" in rows["Torch.matmul.0"]["Message"]
    # the limit is the user's to set: a lower one refuses the small API too, naming the option
    rows, _ = acc_check(dump, tmp_path / "out_small", tmp_path, "--max-elements", "20")
    assert rows["Functional.relu.0"]["Forward Test Success"] == "SKIP"
    assert "--max-elements" in rows["Functional.relu.0"]["Message"]


def test_max_elements_must_be_positive(tmp_path):
    dump = write_dump(str(tmp_path / "dump" / "step0" / "rank0"), "pytorch",
                      {"Functional.relu.0.forward": relu_record()})
    proc = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "acc_check", "-api_info", dump,
                           "--max-elements", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "--max-elements 0" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_mindspore_dump_naming_a_process_class_and_a_file_writer(tmp_path):
    pytest.importorskip("mindspore")
    marker = tmp_path / "popen_ran"
    data = {
        "Primitive.evil.Popen.0.forward": {"input_args": [tensor("Float32", [2], "mindspore")], "input_kwargs": {},
                                           "output": [tensor("Float32", [2], "mindspore")]},
        "Functional.tensordump.0.forward": {"input_args": [text(str(tmp_path / "written")),
                                                           tensor("Float32", [2], "mindspore")],
                                            "input_kwargs": {}, "output": []},
        "Mint.abs.0.forward": relu_record("mindspore", "Float32"),
    }
    dump = write_dump(str(tmp_path / "dump" / "step0" / "rank0"), "mindspore", data, {"primitives": {
        "Primitive.evil.Popen": {"instances": [{"class": "subprocess.Popen",
                                                "init": {"args": f"touch {marker}", "shell": True}}],
                                 "calls": [0]}}})
    rows, _ = acc_check(dump, tmp_path / "out", tmp_path)
    assert not marker.exists() and not list(tmp_path.glob("written*"))
    assert rows["Mint.abs.0"]["Forward Test Success"] == "pass"
    for name in ("Primitive.evil.Popen.0", "Functional.tensordump.0"):
        assert rows[name]["Forward Test Success"] == "SKIP", name
        assert rows[name]["Message"].startswith("refused: "), rows[name]["Message"]


@pytest.mark.parametrize("flags, message", [(("-d", "-1"), "-d -1: device ids are integers >= 0"),
                                            (("--max-elements", "0"), "--max-elements 0: expected a number")])
def test_a_bad_device_or_limit_is_one_line_from_the_command_and_from_python(tmp_path, flags, message):
    """The runner checks its options, so a Python caller meets the command's errors, before any reading."""
    from msprobe.core.acc_check.runner import run_acc_check, run_multi_acc_check
    from msprobe.core.errors import MsprobeError
    dump = write_dump(str(tmp_path / "rank0"), "pytorch", {"Functional.relu.0.forward": relu_record()})
    proc = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "multi_acc_check", "-api_info", dump,
                           "-o", str(tmp_path / "out"), *flags], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.startswith(f"msprobe multi_acc_check: {message}"), proc.stderr
    assert proc.stderr.count("\n") == 1
    kwargs = {"device": -1} if flags[0] == "-d" else {"max_elements": 0}
    with pytest.raises(MsprobeError, match=message):
        run_acc_check(dump, out_path=str(tmp_path / "out"), **kwargs)
    with pytest.raises(MsprobeError, match=message):
        run_multi_acc_check(dump, out_path=str(tmp_path / "out"),
                            **({"devices": [0, -1]} if flags[0] == "-d" else kwargs))
    assert not os.path.exists(tmp_path / "out")

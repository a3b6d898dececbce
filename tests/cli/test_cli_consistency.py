"""The `msprobe` command behaves alike across subcommands: shared options in both spellings, a
subcommand's own usage on a bad flag, aliases shown as aliases, one prefix per error line, and a quiet
end when the reader of its output goes away (`| head`)."""

import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compare"))
from compare_fixtures import tensor, write_dump  # noqa: E402

MSPROBE = shutil.which("msprobe", path=os.path.dirname(sys.executable)) or shutil.which("msprobe")
PROGRESS_COMMANDS = ("compare", "graph_visualize", "graph", "overflow_check", "grad_compare", "acc_check")


def run(*args, **kw):
    return subprocess.run([MSPROBE, *args], capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize("command", PROGRESS_COMMANDS)
def test_no_progress_is_one_option_in_both_spellings(command):
    out = run(command, "-h")
    assert out.returncode == 0, out.stderr
    assert "--no-progress, --no_progress" in out.stdout


def test_both_spellings_run(tmp_path):
    data = {"Functional.relu.0.forward": {"input_args": [tensor(1.0, -1.0, 0.1, 2.0)], "input_kwargs": {},
                                          "output": [tensor(1.0, 0.0, 0.5, 1.5)]}}
    t, g = write_dump(tmp_path / "t", data), write_dump(tmp_path / "g", data)
    for flag in ("--no-progress", "--no_progress"):
        out = run("compare", "-tp", t, "-gp", g, "-o", str(tmp_path / flag), flag)
        assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("command, required", [("compare", ()), ("overflow_check", ("-i", "x")),
                                               ("graph_visualize", ("-tp", "x", "-o", "y"))])
def test_a_bad_flag_shows_the_subcommands_own_usage(command, required):
    out = run(command, *required, "--bogus-flag")
    assert out.returncode == 2
    assert f"usage: msprobe {command}" in out.stderr
    assert "unrecognized arguments: --bogus-flag" in out.stderr


def test_aliases_are_listed_as_aliases_and_work():
    top = run("-h").stdout
    assert "acc_check (run_ut)" in top and "multi_acc_check (multi_run_ut)" in top
    assert "\n    run_ut " not in top  # not a command of its own
    alias = run("run_ut", "-h")
    assert alias.returncode == 0 and "-api_info" in alias.stdout


@pytest.mark.parametrize("args, command", [(("compare", "-tp", "/no/such", "-gp", "/no/such"), "compare"),
                                           (("monitor_report", "-i", "/no/such"), "monitor_report")])
def test_an_error_line_names_its_command_once(args, command):
    out = run(*args)
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"msprobe {command}: ") and f"{command}: {command}:" not in line
    assert "Traceback" not in out.stderr


def test_output_cut_short_by_head_ends_quietly(tmp_path):
    """`msprobe compare ... -tensor_log | head -1`: the reader leaves after one line."""
    calls = 3000
    target = {f"Functional.f.{i}.forward": {"input_args": [tensor(1.0, -1.0, 0.1, 2.0)], "input_kwargs": {},
                                            "output": [tensor(5.0, 0.0, 3.0, 9.0)]} for i in range(calls)}
    golden = {f"Functional.f.{i}.forward": {"input_args": [tensor(1.0, -1.0, 0.1, 2.0)], "input_kwargs": {},
                                            "output": [tensor(1.0, 0.0, 0.5, 1.5)]} for i in range(calls)}
    t, g = write_dump(tmp_path / "t", target), write_dump(tmp_path / "g", golden)
    proc = subprocess.Popen([MSPROBE, "compare", "-tp", t, "-gp", g, "-o", str(tmp_path / "o"), "-tensor_log",
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert "statistics compare" in first
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err

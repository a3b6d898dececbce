"""A run never overwrites or mixes with another's files, and writes them as msProbe does.

Reruns: a second run into the same dump_path and rank is refused at its first start() in one line,
the first run's files untouched; runs without a rank write proc{pid} dirs beside each other; two
rank-0 jobs started together never silently leave one dump. Files: dirs 0750 and files 0640 under
umask 000, for a dump and for compare's output; a symbolic link planted where a step dir goes is
refused (nothing written through it) and training goes on.
"""

import json
import logging
import os
import stat
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from msprobe.core.errors import MsprobeError
from msprobe.core.safe_files import UnsafePathError, open_new
from msprobe.pytorch import PrecisionDebugger


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _step(debugger, model, rank_id=None):
    debugger.start(model, rank_id=rank_id)
    model(torch.randn(3, 8)).sum().backward()
    debugger.stop()
    debugger.step()


def _files(root):
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[p] = f.read()
    return out


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_a_rerun_into_the_same_rank_is_refused_and_the_first_kept(tmp_path):
    model = _model()
    first = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    for _ in range(2):
        _step(first, model, rank_id=0)
    before = _files(tmp_path)
    second = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="mix")
    with pytest.raises(MsprobeError, match=r"step0/rank0 already holds a dump from another run.*new dump_path") as e:
        second.start(model, rank_id=0)
    assert "\n" not in str(e.value)
    model(torch.randn(3, 8)).sum().backward()  # the user's model is left as it was
    assert _files(tmp_path) == before


def test_a_run_reopens_its_own_step(tmp_path):
    model = _model()
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L1")
    debugger.start(model, rank_id=0)
    model(torch.randn(3, 8))
    debugger.close()
    _step(debugger, model, rank_id=0)  # the same step again, by the same run
    assert _load(tmp_path / "step0" / "rank0" / "dump.json")["data"]


RUN = textwrap.dedent('''
    import os, sys, time, torch
    from torch import nn
    from msprobe.pytorch import PrecisionDebugger
    dump_path, rank, go = sys.argv[1], sys.argv[2], sys.argv[3]
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    debugger = PrecisionDebugger(dump_path=dump_path, task="statistics", level="L1")
    while not os.path.exists(go):  # both start together
        time.sleep(0.001)
    for _ in range(3):
        debugger.start(model, rank_id=None if rank == "none" else int(rank))
        model(torch.randn(3, 8)).sum().backward()
        debugger.stop()
        debugger.step()
    print("TRAINED", flush=True)
''')


def _together(tmp_path, rank):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    go = tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "dump"), rank, str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    import time
    time.sleep(3)  # both imported and waiting
    go.write_text("")
    return [p.communicate(timeout=120) + (p.returncode,) for p in procs]


def test_runs_without_a_rank_write_beside_each_other(tmp_path):
    results = _together(tmp_path, "none")
    assert all(rc == 0 for _, _, rc in results), results
    for step in range(3):
        procs = os.listdir(tmp_path / "dump" / f"step{step}")
        assert len(procs) == 2 and all(p.startswith("proc") for p in procs)
        for p in procs:
            assert _load(tmp_path / "dump" / f"step{step}" / p / "dump.json")["data"]


def test_two_rank0_jobs_never_silently_leave_one_dump(tmp_path):
    results = _together(tmp_path, "0")
    said = [err for _, err, _ in results if "already holds a dump from another run" in err]
    assert len(said) == 1, results  # the second to make step0/rank0 says so (refused or stopped)
    assert sum("TRAINED" in out for out, _, _ in results) >= 1
    for step in range(3):
        dump = tmp_path / "dump" / f"step{step}" / "rank0" / "dump.json"
        keys = list(_load(dump)["data"])
        assert keys and len(keys) == len(set(keys))  # one run's records, whole


def test_dirs_0750_files_0640_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        model = _model()
        debugger = PrecisionDebugger(dump_path=str(tmp_path / "dump"), task="tensor", level="mix")
        _step(debugger, model)
        debugger.close()
        dumps = {}
        for d, dirs, names in os.walk(tmp_path / "dump"):
            dumps.update({os.path.join(d, n): 0o750 for n in dirs})
            dumps.update({os.path.join(d, n): 0o640 for n in names})
        assert any(p.endswith(".npy") for p in dumps) and any(p.endswith("stack.json") for p in dumps)
        assert {p: stat.S_IMODE(os.stat(p).st_mode) for p in dumps} == dumps
        (rank,) = os.listdir(tmp_path / "dump" / "step0")
        run = str(tmp_path / "dump" / "step0" / rank)
        out = tmp_path / "out" / "compare"
        done = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "compare", "-tp", run, "-gp", run, "-o", str(out)],
                              capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        assert done.returncode == 0, done.stderr
    finally:
        os.umask(old)
    written = [os.path.join(d, n) for d, _, names in os.walk(out) for n in names]
    assert written and {stat.S_IMODE(os.stat(p).st_mode) for p in written} == {0o640}
    assert {stat.S_IMODE(os.stat(d).st_mode) for d in (out, out.parent)} == {0o750}


def test_a_link_planted_where_a_step_dir_goes_is_not_written_through(tmp_path, caplog):
    victim = tmp_path / "victim"
    victim.mkdir()
    dump = tmp_path / "dump"
    dump.mkdir()
    os.symlink(victim, dump / "step0")
    model = _model()
    debugger = PrecisionDebugger(dump_path=str(dump), task="statistics", level="L1")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            _step(debugger, model)
    assert os.listdir(victim) == []
    warned = [r.getMessage() for r in caplog.records if "stopped dumping" in r.getMessage()]
    assert len(warned) == 1 and "symbolic link" in warned[0], warned


def test_a_link_is_never_opened_for_writing(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    os.symlink(target, tmp_path / "dump.json")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        open_new(tmp_path / "dump.json")
    assert target.read_text() == "keep"

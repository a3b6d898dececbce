"""A training process killed by SIGKILL in the middle of a step leaves a readable dump.

Guaranteed (what these tests check):
  * steps finished before the kill (stop() + step() returned) are complete: dump.json, construct.json and
    stack.json all parse and hold the same records as an uninterrupted run;
  * for the killed step, dump.json and construct.json parse with plain `json.load` at any moment: each
    batch of records is appended in one write that leaves the file valid (core/dump/json_append.py), and a write to
    a regular file completes even when SIGKILL arrives;
  * of the killed step, the records written by the last resolve (core/dump/capture.py: at stop(), and at
    least every FLUSH_SECONDS while recording): here every forward record, written by the stop() between
    forward and backward; every record the writer reported as written (`writer.records`) is in that
    dump.json. Also on the accelerator path (forced here with MSPROBE_DEVICE_SUMMARY=1).

Not guaranteed:
  * stack.json of the killed step: written at flush (stop/step/exit) and by the idle flusher
    (tests/core/dump/test_signals.py checks it after an idle kill), not here, killed mid-backward;
  * records made after the last resolve (here the backward records before the kill);
  * records still waiting for background work (files of device tensors, copied to the host and written on
    the writer pool) at the kill, and everything after them in capture order (held back to keep dump.json in
    capture order); a tensor file being written at the kill (CPU tensors' files and md5 checksums are done
    on the training thread before their record is appended, so a record on disk has its files).
"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from msprobe.core.naming import split_key

# both scripts: a small model, its optimizer and a mix debugger; argv: dump_path, "crash" or "clean"
PREAMBLE = textwrap.dedent('''
    import os, signal, sys, time
    import torch
    from torch import nn
    from msprobe.pytorch import PrecisionDebugger

    dump_path, mode = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    debugger = PrecisionDebugger(dump_path=dump_path, level="mix")
    x, y = torch.randn(5, 8), torch.randn(5, 4)
''')

SCRIPT = PREAMBLE + textwrap.dedent('''
    for step in range(2):
        debugger.start(model)
        h = model[1](model[0](x))
        if mode == "crash" and step == 1:
            def die(grad):
                # backward is half done: the layers after h have their gradients, the first has not
                writer = debugger._session.writer
                print("RECORDS", writer.records, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            h.register_hook(die)
        out = model[4](model[3](model[2](h)))
        loss = nn.functional.mse_loss(out, y)
        debugger.stop()  # writes the forward records
        debugger.start(model)
        loss.backward()
        debugger.stop()
        opt.step()
        opt.zero_grad()
        debugger.step()
    print("FINISHED", flush=True)
''')


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def only_subdir(path):
    subdirs = os.listdir(path)
    assert len(subdirs) == 1 and subdirs[0].startswith("proc"), subdirs
    return os.path.join(path, subdirs[0])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One clean run and one run killed in step 1, started together (about 5 s)."""
    tmp = tmp_path_factory.mktemp("crash")
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    procs = {mode: subprocess.Popen([sys.executable, str(script), str(tmp / mode), mode],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp))
             for mode in ("clean", "crash")}
    out = {}
    try:
        for mode, p in procs.items():
            try:
                stdout, stderr = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                stdout, stderr = p.communicate()
            out[mode] = (p.returncode, stdout, stderr, tmp / mode)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def test_clean_run_finishes(runs):
    rc, stdout, stderr, _ = runs["clean"]
    assert rc == 0, stderr
    assert "FINISHED" in stdout


def test_killed_by_sigkill_in_step1(runs):
    rc, stdout, stderr, _ = runs["crash"]
    assert rc == -signal.SIGKILL, (rc, stdout, stderr)
    assert "RECORDS" in stdout and "FINISHED" not in stdout


def test_step0_complete(runs):
    clean = only_subdir(runs["clean"][3] / "step0")
    crash = only_subdir(runs["crash"][3] / "step0")
    for name in ("dump.json", "construct.json", "stack.json"):
        assert os.path.isfile(os.path.join(crash, name)), name
    crash_dump, clean_dump = load(os.path.join(crash, "dump.json")), load(os.path.join(clean, "dump.json"))
    assert crash_dump["level"] == "mix" and crash_dump["task"] == "statistics"
    assert list(crash_dump["data"]) == list(clean_dump["data"])
    assert crash_dump["data"] == clean_dump["data"]  # same seed, same numbers
    assert load(os.path.join(crash, "construct.json")) == load(os.path.join(clean, "construct.json"))
    crash_stack = load(os.path.join(crash, "stack.json"))
    assert crash_stack and {k for keys, _ in crash_stack.values() for k in keys} == \
        {k for keys, _ in load(os.path.join(clean, "stack.json")).values() for k in keys}
    # backward and parameter gradients of step 0 are there too
    keys = list(crash_dump["data"])
    assert any(split_key(k)[1] == "backward" for k in keys)
    assert any(split_key(k)[1] == "parameters_grad" for k in keys)


def test_killed_step_dump_json_parses_and_holds_every_forward_record(runs):
    _, stdout, _, crash_root = runs["crash"]
    crash = only_subdir(crash_root / "step1")
    clean = only_subdir(runs["clean"][3] / "step1")
    doc = load(os.path.join(crash, "dump.json"))  # plain json.load, no repair
    assert doc["task"] == "statistics" and doc["level"] == "mix"
    data = doc["data"]
    clean_data = load(os.path.join(clean, "dump.json"))["data"]

    clean_forward = [k for k in clean_data if split_key(k)[1] == "forward"]
    crash_forward = [k for k in data if split_key(k)[1] == "forward"]
    assert len(clean_forward) >= 10
    assert crash_forward == clean_forward
    for key in clean_forward:
        assert data[key] == clean_data[key], key

    # every record the writer had counted as written when the process died is on disk
    written = int(stdout.split("RECORDS", 1)[1].split()[0])
    assert len(data) == written
    # the backward records made before the kill waited for the next resolve: none is there, none torn
    assert not [k for k in data if split_key(k)[1] == "backward"]
    assert "Module.0.Linear.backward.0" not in data  # the first layer's gradient never came


def test_killed_step_construct_json_parses(runs):
    crash = only_subdir(runs["crash"][3] / "step1")
    clean = only_subdir(runs["clean"][3] / "step1")
    construct = load(os.path.join(crash, "construct.json"))
    clean_construct = load(os.path.join(clean, "construct.json"))
    data = load(os.path.join(crash, "dump.json"))["data"]
    for key in data:  # every record written has its node, with the same parent as in the clean run
        if split_key(key)[1] in ("forward", "backward"):
            assert construct[key] == clean_construct[key], key
    assert construct["Functional.linear.0.forward"] == "Module.0.Linear.forward.0"


def test_killed_step_stack_json_if_present_parses(runs):
    """stack.json of the killed step is not guaranteed (written at flush only); if there, it parses."""
    crash = only_subdir(runs["crash"][3] / "step1")
    path = os.path.join(crash, "stack.json")
    if os.path.exists(path):
        load(path)
    assert not os.path.exists(path + ".tmp")


# -- the accelerator path: records wait for a batch resolve -----------------------------------------------
BATCHED = PREAMBLE + textwrap.dedent('''
    from msprobe.core.dump.capture import FLUSH_SECONDS
    for step in range(2):
        debugger.start(model)
        h = model[1](model[0](x))
        if step == 1:
            time.sleep(FLUSH_SECONDS + 0.2)  # the next record resolves and writes those before it
            if mode == "crash":
                h.register_hook(lambda grad: os.kill(os.getpid(), signal.SIGKILL))
        out = model[4](model[3](model[2](h)))
        nn.functional.mse_loss(out, y).backward()
        debugger.stop()
        opt.step()
        opt.zero_grad()
        debugger.step()
    print("FINISHED", flush=True)
''')


@pytest.fixture(scope="module")
def batched_runs(tmp_path_factory):
    """The script above through the device path (summaries in slots, records written at a resolve)."""
    tmp = tmp_path_factory.mktemp("batched")
    script = tmp / "train.py"
    script.write_text(BATCHED)
    env = dict(os.environ, MSPROBE_DEVICE_SUMMARY="1")
    out = {}
    for mode in ("clean", "crash"):
        p = subprocess.run([sys.executable, str(script), str(tmp / mode), mode], capture_output=True, text=True,
                           cwd=str(tmp), env=env, timeout=120)
        out[mode] = (p.returncode, p.stdout, p.stderr, tmp / mode)
    return out


def test_batched_kill_keeps_finished_steps_and_what_was_flushed(batched_runs):
    assert batched_runs["clean"][0] == 0 and "FINISHED" in batched_runs["clean"][1]
    rc, stdout, stderr, crash_root = batched_runs["crash"]
    assert rc == -signal.SIGKILL, (rc, stdout, stderr)
    clean_root = batched_runs["clean"][3]
    # the finished step is whole
    crash0, clean0 = only_subdir(crash_root / "step0"), only_subdir(clean_root / "step0")
    assert load(os.path.join(crash0, "dump.json"))["data"] == load(os.path.join(clean0, "dump.json"))["data"]
    assert load(os.path.join(crash0, "construct.json")) == load(os.path.join(clean0, "construct.json"))
    # the killed step: the records resolved by time before the kill, nothing torn
    data = load(os.path.join(only_subdir(crash_root / "step1"), "dump.json"))["data"]
    clean = load(os.path.join(only_subdir(clean_root / "step1"), "dump.json"))["data"]
    before_sleep = ["Functional.linear.0.forward", "Module.0.Linear.forward.0", "Functional.relu.0.forward",
                    "Module.1.ReLU.forward.0"]
    keys = list(data)
    assert keys[:len(before_sleep)] == before_sleep  # (the resolve also took the next call's summaries)
    assert keys == list(clean)[:len(keys)] and len(keys) < len(clean)
    for key in keys:
        assert data[key] == clean[key], key

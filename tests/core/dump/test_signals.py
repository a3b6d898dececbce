"""A process killed while idle or busy keeps every record it captured (core/dump/flusher.py).

Each child trains one step of a small real model (forward and backward, no stop()/step()), prints
READY, then sleeps (idle: asleep or hung in a collective makes no record) or spins in Python (busy);
the test sends a real signal 1.5 s later. dump.json, construct.json and stack.json of the step must
parse and hold exactly the records of a clean run's step (stop() + step()). SIGTERM and SIGINT
flush, then the process behaves as without msprobe: it dies of SIGTERM, raises KeyboardInterrupt
on SIGINT, or runs the user's own handler. `torch-device` is PyTorch on the accelerator's path
(`MSPROBE_DEVICE_SUMMARY=1`: statistics in device slots, read back in batches), whose summaries are
read back and written as the backward pass ends; `mindspore-lm` takes integer token ids and a strided
view, which the flusher reads without a MindSpore op too.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

TORCH = textwrap.dedent('''
    import torch
    from torch import nn
    from msprobe.pytorch import PrecisionDebugger
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x, y = torch.randn(5, 8), torch.randn(5, 4)

    def train_step():
        debugger.start(model)
        nn.functional.mse_loss(model(x), y).backward()
''')

MINDSPORE = textwrap.dedent('''
    import numpy as np
    import mindspore as ms
    from mindspore import mint, nn
    from msprobe.mindspore import PrecisionDebugger
    ms.set_seed(0)
    model = nn.SequentialCell([nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4)])
    x = ms.Tensor(np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32))
    y = ms.Tensor(np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32))
    grad_fn = ms.value_and_grad(lambda a, b: mint.mean((model(a) - b) ** 2), None, model.trainable_params())

    def train_step():
        debugger.start(model)
        grad_fn(x, y)
''')

# a language model's shape of data: integer token ids into an Embedding, a transposed (strided) view
MINDSPORE_LM = textwrap.dedent('''
    import numpy as np
    import mindspore as ms
    from mindspore import mint, nn
    from msprobe.mindspore import PrecisionDebugger
    ms.set_seed(0)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.fc = nn.Dense(16, 4)

        def construct(self, ids):
            return self.fc(self.emb(ids).transpose(1, 0, 2))

    model = Net()
    x = ms.Tensor(np.random.default_rng(0).integers(0, 50, (2, 5)).astype(np.int32))
    y = ms.Tensor(np.zeros((5, 2, 4), np.float32))
    grad_fn = ms.value_and_grad(lambda a, b: mint.mean((model(a) - b) ** 2), None, model.trainable_params())

    def train_step():
        debugger.start(model)
        grad_fn(x, y)
''')

MAIN = textwrap.dedent('''
    import os, signal, sys, time
    dump_path, mode = sys.argv[1], sys.argv[2]
    if mode == "user-handler":
        def mine(signum, frame):
            print("USER HANDLER", flush=True)
            sys.exit(7)
        signal.signal(signal.SIGTERM, mine)
    debugger = PrecisionDebugger(dump_path=dump_path, level="mix")
    try:
        train_step()
        if mode == "clean":  # backward records that only the step's end writes (no gradient for x)
            print("STUCK", *[t.key for t in debugger._session.trackers], flush=True)
            debugger.stop()
            debugger.step()
            sys.exit(0)
        print("READY", flush=True)
        if mode == "busy":
            n = 0
            while True:
                n += 1
        time.sleep(120)
    except KeyboardInterrupt:
        print("KEYBOARD INTERRUPT", flush=True)
        raise
''')

FRAMEWORKS = {"torch": TORCH, "torch-device": TORCH, "mindspore": MINDSPORE, "mindspore-lm": MINDSPORE_LM}
DEVICE_PATH = {"torch-device": "1"}  # MSPROBE_DEVICE_SUMMARY of the child (the host path otherwise)


def _available(name):
    try:
        __import__(name.split("-")[0])
    except ImportError:
        return False
    return True


def _spawn(tmp_path, framework, mode, name):
    script = tmp_path / f"{name}.py"
    script.write_text(FRAMEWORKS[framework] + MAIN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path),
               MSPROBE_DEVICE_SUMMARY=DEVICE_PATH.get(framework, "0"))
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / name), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _rank_dir(path):
    step = path / "step0"
    (rank,) = os.listdir(step)
    return step / rank


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _dump(path):
    rank = _rank_dir(path)
    return {name: _load(rank / name) for name in ("dump.json", "construct.json", "stack.json")}


def _name(case):
    framework, mode, sig = case
    return f"{framework}-{mode}-{sig.name}"


# (framework, mode, signal): idle and busy processes, each signal, a user's own handler
CASES = [
    ("torch", "idle", signal.SIGKILL), ("torch", "busy", signal.SIGKILL), ("torch", "idle", signal.SIGTERM),
    ("torch", "busy", signal.SIGINT), ("torch", "user-handler", signal.SIGTERM),
    ("torch-device", "idle", signal.SIGKILL), ("torch-device", "busy", signal.SIGKILL),
    ("torch-device", "idle", signal.SIGTERM),
    ("mindspore", "idle", signal.SIGKILL), ("mindspore", "busy", signal.SIGTERM),
    ("mindspore-lm", "idle", signal.SIGKILL),
]


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """Every case and one clean run per framework, run side by side."""
    tmp = tmp_path_factory.mktemp("signals")
    cases = [c for c in CASES if _available(c[0])]
    clean = {fw: _spawn(tmp, fw, "clean", f"{fw}_clean") for fw in {c[0] for c in cases}}
    procs = {c: _spawn(tmp, c[0], c[1], _name(c)) for c in cases}
    results = {}
    try:
        for case, p in procs.items():
            line = p.stdout.readline()
            assert line.strip() == "READY", (line, p.stderr.read() if p.poll() is not None else "")
        time.sleep(1.5)  # no record in the last 1.5 s
        for (fw, mode, sig), p in procs.items():
            p.send_signal(sig)
        for case, p in procs.items():
            out, err = p.communicate(timeout=60)
            results[case] = (p.returncode, out, err, tmp / _name(case))
        for fw, p in clean.items():
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            stuck = next(line for line in out.splitlines() if line.startswith("STUCK")).split()[1:]
            results[fw] = (_dump(tmp / f"{fw}_clean"), stuck)
    finally:
        for p in list(procs.values()) + list(clean.values()):
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


@pytest.mark.parametrize("case", CASES, ids=[_name(c) for c in CASES])
def test_the_killed_step_is_on_disk(killed, case):
    if not _available(case[0]):
        pytest.skip(f"{case[0]} cannot be imported")
    rc, out, err, path = killed[case]
    clean, stuck = killed[case[0]]
    dump = _dump(path)
    assert dump["dump.json"]["data"], err
    expected = list(clean["dump.json"]["data"])
    if case[2] == signal.SIGKILL:  # (a handled signal writes them, as the step's end does)
        expected = [k for k in expected if k not in stuck]
    assert list(dump["dump.json"]["data"]) == expected
    assert any(".backward." in k for k in dump["dump.json"]["data"])
    assert dump["construct.json"] == {k: v for k, v in clean["construct.json"].items() if k in expected}
    assert sorted(k for v in dump["stack.json"].values() for k in v[0]) == \
        sorted(k for v in clean["stack.json"].values() for k in v[0] if k in expected)


@pytest.mark.parametrize("case", CASES, ids=[_name(c) for c in CASES])
def test_the_process_ends_as_it_would_without_msprobe(killed, case):
    if not _available(case[0]):
        pytest.skip(f"{case[0]} cannot be imported")
    rc, out, err, _ = killed[case]
    fw, mode, sig = case
    if mode == "user-handler":
        assert rc == 7 and "USER HANDLER" in out, (rc, out, err)
    elif sig == signal.SIGINT:
        assert rc == -signal.SIGINT and "KEYBOARD INTERRUPT" in out and "KeyboardInterrupt" in err, (rc, out, err)
    else:
        assert rc == -sig, (rc, out, err)

"""A full disk or an unwritable dump_path never kills training.

On a real tmpfs of a few steps' files: a statistics dump and a tensor dump of a real model fill it; training runs
every step, msprobe says so once and writes nothing more, every step's files are whole except the one
that met the full disk, whose dump.json says `"incomplete"` (never a file that looks whole), and every
tensor file left loads. A dump_path that is a file, a symbolic link or on a read-only file system is
refused at construction in one line.
"""

import errno
import json
import logging
import os
import subprocess

import numpy as np
import pytest
import torch
from torch import nn

from msprobe.core.dump.tensor_files import load_tensor_file, write_npy
from msprobe.core.errors import ConfigError
from msprobe.pytorch import PrecisionDebugger


def _mount(path, options):
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")


@pytest.fixture
def disk_of(tmp_path):
    """Mounts a tmpfs of the size given (e.g. "256k"); each is unmounted after the test."""
    mounted = []

    def mount(size):
        disk = tmp_path / f"disk{len(mounted)}"
        _mount(disk, f"size={size},mode=0755")
        mounted.append(disk)
        return disk
    yield mount
    for disk in mounted:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.fixture
def small_disk(disk_of):
    return disk_of("256k")


@pytest.fixture
def read_only_disk(tmp_path):
    disk = tmp_path / "ro"
    _mount(disk, "size=64k,ro")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def _train(debugger, steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randn(16, 4)
    losses = []
    for _ in range(steps):
        debugger.start(model)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
        losses.append(loss.item())
    return losses


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# a few whole steps fit before the disk is full: a step's files take ~45 KiB (statistics), ~250 KiB (tensor)
@pytest.mark.parametrize("task,size", [("statistics", "256k"), ("tensor", "1m")], ids=["statistics", "tensor"])
def test_training_outlives_a_full_disk(disk_of, caplog, task, size):
    small_disk = disk_of(size)
    debugger = PrecisionDebugger(dump_path=str(small_disk), task=task, level="mix")
    with caplog.at_level(logging.WARNING):
        losses = _train(debugger, steps=60)
    debugger.close()
    assert len(losses) == 60 and all(l == l for l in losses)  # every step trained
    warned = [r.getMessage() for r in caplog.records if "stopped dumping" in r.getMessage()]
    assert len(warned) == 1 and "No space left on device" in warned[0], warned

    steps = sorted(int(d[4:]) for d in os.listdir(small_disk))
    assert steps == list(range(len(steps))) and len(steps) < 60  # nothing after the failure
    whole, incomplete = [], []
    for step in steps:
        (rank,) = os.listdir(small_disk / f"step{step}")
        rank_dir = small_disk / f"step{step}" / rank
        try:
            dump = _load(rank_dir / "dump.json")
        except (FileNotFoundError, ValueError):
            incomplete.append(step)  # cut short: never looks whole
            continue
        if "incomplete" in dump:
            incomplete.append(step)
            assert "No space left" in dump["incomplete"]
        else:
            whole.append((step, list(dump["data"])))
            _load(rank_dir / "construct.json")
            _load(rank_dir / "stack.json")
        for name in os.listdir(rank_dir / "dump_tensor_data") if task == "tensor" else []:
            load_tensor_file(rank_dir / "dump_tensor_data" / name)  # every tensor file left is whole
    # the step that met the full disk is marked, or, when its files could not even be opened, not there
    assert incomplete in ([], [steps[-1]]), (incomplete, steps)
    assert whole and all(keys == whole[0][1] for _, keys in whole)  # whole steps hold every record


def test_a_dump_path_that_is_a_file_is_refused(tmp_path):
    path = tmp_path / "f"
    path.write_text("")
    with pytest.raises(ConfigError, match=r"'dump_path'.*this is a file") as e:
        PrecisionDebugger(dump_path=str(path))
    assert "\n" not in str(e.value)


def test_a_dump_path_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(ConfigError, match=r"'dump_path'.*symbolic link"):
        PrecisionDebugger(dump_path=str(tmp_path / "link"))


def test_a_dump_path_on_a_read_only_disk_is_refused(read_only_disk):
    with pytest.raises(ConfigError, match=r"'dump_path'.*not writable"):
        PrecisionDebugger(dump_path=str(read_only_disk))
    with pytest.raises(ConfigError, match=r"'dump_path'.*not writable"):
        PrecisionDebugger(dump_path=str(read_only_disk / "new" / "dir"))


def test_mindspore_training_outlives_a_full_disk(small_disk, caplog):
    ms = pytest.importorskip("mindspore", reason="mindspore cannot be imported")
    import numpy as np
    from mindspore import mint
    from msprobe.mindspore import PrecisionDebugger as MsDebugger
    ms.set_seed(0)
    net = ms.nn.SequentialCell([ms.nn.Dense(32, 64), ms.nn.ReLU(), ms.nn.Dense(64, 4)])
    opt = ms.nn.SGD(net.trainable_params(), learning_rate=0.01)
    grad_fn = ms.value_and_grad(lambda a, b: mint.mean((net(a) - b) ** 2), None, opt.parameters)
    x = ms.Tensor(np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32))
    y = ms.Tensor(np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32))
    debugger = MsDebugger(dump_path=str(small_disk), task="tensor", level="L1")
    losses = []
    with caplog.at_level(logging.WARNING):
        for _ in range(20):
            debugger.start(net)
            loss, grads = grad_fn(x, y)
            opt(grads)
            debugger.stop()
            debugger.step()
            losses.append(float(loss.asnumpy()))
    debugger.close()
    assert len(losses) == 20
    warned = [r.getMessage() for r in caplog.records if "stopped dumping" in r.getMessage()]
    # the tensor file's write may fail as ENOSPC or as numpy's short write, whichever reaches the limit
    assert len(warned) == 1 and ("No space left on device" in warned[0] or "disk may be full" in warned[0]), warned
    steps = sorted(int(d[4:]) for d in os.listdir(small_disk))
    assert len(steps) < 20
    for step in steps:
        (rank,) = os.listdir(small_disk / f"step{step}")
        rank_dir = small_disk / f"step{step}" / rank
        try:
            dump = _load(rank_dir / "dump.json")
        except (FileNotFoundError, ValueError):
            assert step == steps[-1]
            continue
        assert "incomplete" not in dump or step == steps[-1]
        for name in os.listdir(rank_dir / "dump_tensor_data"):
            if not name.startswith("."):
                load_tensor_file(rank_dir / "dump_tensor_data" / name)


def test_a_tensor_file_cut_by_a_full_disk_is_said_to_be_one_and_removed(small_disk):
    """numpy's writer reports a short write without a cause; a tensor file that filled the disk says ENOSPC
    (the warning's "No space left on device") and leaves no short file to pass for a tensor."""
    path = small_disk / "big.npy"
    with pytest.raises(OSError) as caught:
        write_npy(str(path), np.zeros(128 * 1024, dtype=np.float32))  # 512 KiB on a 256 KiB disk
    assert caught.value.errno == errno.ENOSPC, caught.value
    assert not path.exists()

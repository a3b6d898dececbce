"""The two ways the MindSpore adapter sees a call's gradients give the same records: with ops running
synchronously (always while capturing on a CPU target) autograd-node hooks, views with tensor hooks and
hooks on API and Cell outputs themselves (a Cell returning what a call inside it returned, as the
transformer's attention and SequentialCell do, keeps a view); otherwise (MindSpore's asynchronous pipeline, e.g. on an accelerator) HookBackward stand-ins
(capture/backward.py)."""

import glob
import json

import pytest

pytest.importorskip("mindspore", reason="mindspore cannot be imported (make setup installs it)")


def _records(root):
    files = sorted(glob.glob(str(root / "step*" / "*" / "dump.json")))
    assert len(files) == 2, files  # two steps
    return [json.load(open(f))["data"] for f in files]


@pytest.mark.parametrize("name", ["transformer", "mlp", "cnn"])
@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_synchronous_and_asynchronous_ways_record_the_same(models, tmp_path, monkeypatch, name, level):
    from msprobe.mindspore.sync_execution import SynchronousOps
    seen = []
    real = SynchronousOps.synchronous

    def spy():
        seen.append(real())
        return seen[-1]
    monkeypatch.setattr(SynchronousOps, "synchronous", staticmethod(spy))
    (tmp_path / "sync").mkdir()
    (tmp_path / "async").mkdir()
    sync_root, sync_losses = models.run_dump(tmp_path / "sync", name, level)
    assert seen and all(seen)  # the synchronous way was taken
    monkeypatch.setattr(SynchronousOps, "synchronous", staticmethod(lambda: False))
    async_root, async_losses = models.run_dump(tmp_path / "async", name, level)
    assert sync_losses == async_losses
    sync, other = _records(sync_root), _records(async_root)
    for step_sync, step_other in zip(sync, other):
        assert sorted(step_sync) == sorted(step_other)
        assert any(".backward" in k for k in step_sync)
        for key in step_sync:
            assert step_sync[key] == step_other[key], key

"""Small dense host tensors are read again at every record (cache.UNKEYED_MAX): no memory key, cache entry
or object-table row, by the C path (msprobe._record) and the Python path alike; what asks for the entry
(`summarize`: a saved file to link) still gets one, and views, large tensors and the device path stay keyed."""

import pytest
import torch

from msprobe.pytorch.summary import cache, host
from msprobe.pytorch.summary.summarizer import Summarizer

pytestmark = pytest.mark.usefixtures("host_path")  # (conftest.py)

TASKS = [dict(stats=True, md5=False), dict(stats=True, md5=True), dict(stats=False, md5=True)]
PATHS = ["c", "python"]


def summarizer(monkeypatch, path, **task):
    if path == "c":
        pytest.importorskip("msprobe._record", reason="msprobe._record not built (no C compiler)")
    monkeypatch.setenv("MSPROBE_NATIVE_RECORD", "1" if path == "c" else "0")
    s = Summarizer(**task)
    monkeypatch.delenv("MSPROBE_NATIVE_RECORD")
    assert (s._fast is not None) == (path == "c")
    return s


def keyed(monkeypatch, **task):
    """A Python-path summarizer that keys every tensor: the record the rule must not change."""
    monkeypatch.setattr(cache, "UNKEYED_MAX", 0)
    s = summarizer(monkeypatch, "python", **task)
    monkeypatch.undo()
    return s


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("task", TASKS, ids=["stats", "stats+md5", "md5"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_small_dense_host_tensors_leave_no_key_entry_or_row(monkeypatch, path, task, dtype):
    torch.manual_seed(0)
    s = summarizer(monkeypatch, path, **task)
    reference = keyed(monkeypatch, **task)
    t = torch.randn(4, 32).to(dtype).requires_grad_(dtype is not torch.bfloat16)
    for shared in (False, True):
        rec = s.record(t, False, shared)
        want = reference.record(t, False, shared)
        assert rec == want and list(rec) == list(want)  # msProbe's field order
        assert s.entry is None and s._cache == {} and s._objects == {}
    assert rec is not s.record(t, False, True)  # read again: a dict of its own each time


@pytest.mark.parametrize("path", PATHS)
def test_the_limit_and_what_stays_keyed(monkeypatch, path):
    """Below UNKEYED_MAX elements a contiguous host tensor is unkeyed; at it, or as a view out of index
    order, or asked for its entry, it is keyed as before."""
    s = summarizer(monkeypatch, path, stats=True, md5=False)
    below = torch.randn(cache.UNKEYED_MAX - 1)
    at = torch.randn(cache.UNKEYED_MAX)
    view = torch.randn(8, 16).t()
    s.record(below)
    assert s.entry is None and s._cache == {}
    s.record(at)
    assert s.entry is not None and list(s._cache.values()) == [s.entry] and id(at) in s._objects
    s.record(view)
    assert s.entry is not None and len(s._cache) == 2 and id(view) in s._objects
    small = torch.randn(3, 5)
    rec, entry = s.summarize(small)
    assert entry is not None and entry.values == {k: rec[k] for k in ("Max", "Min", "Mean", "Norm")}
    assert id(small) in s._objects  # the file saved for it can be linked from a later record


@pytest.mark.parametrize("path", PATHS)
def test_a_change_behind_the_version_counter_is_seen(monkeypatch, path):
    """`.data` writes without bumping the tensor's version: a small tensor's next record reads the new
    values with no `forget` needed."""
    s = summarizer(monkeypatch, path, stats=True, md5=True)
    p = torch.nn.Parameter(torch.zeros(6, 6))
    first = s.record(p)
    p.data.add_(2.0)
    again = s.record(p)
    assert (first["Max"], again["Max"]) == (0.0, 2.0) and first["md5"] != again["md5"]


def test_the_device_path_keys_every_tensor(monkeypatch):
    s = Summarizer(stats=True, md5=False, device_path=True)
    t = torch.randn(4, 8)
    s.record(t)
    s.start_resolve().finish()
    assert s._unkeyed == 0 and s.entry is not None and len(s._cache) == 1


def test_nan_and_inf_take_the_python_path_unkeyed(monkeypatch):
    """The C kernel hands a tensor with a NaN or inf back to Python, which reads it the same way."""
    if host.kernel is None:
        pytest.skip("msprobe._moments not built")
    s = summarizer(monkeypatch, "c", stats=True, md5=False)
    t = torch.tensor([1.0, float("nan"), 3.0, float("inf")])
    rec = s.record(t)
    assert s._fast(s, t, False) is None  # (not the C path's case)
    assert s._cache == {} and s._objects == {} and rec == keyed(monkeypatch, stats=True, md5=False).record(t)

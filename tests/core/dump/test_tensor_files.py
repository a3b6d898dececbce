import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from msprobe.core.dump.tensor_files import LoadedTensor, load_tensor_file, save_npy, write_npy
from msprobe.core.errors import DumpFormatError


def _save_pt(tmp_path, tensor, name="t.pt"):
    path = tmp_path / name
    torch.save(tensor, path)
    return path


def _rewrite_archive(src, dst, changes):
    """Copies the zip ``src`` to ``dst``, replacing members whose names end with a key of ``changes``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            for suffix, new in changes.items():
                if name.endswith(suffix):
                    data = new(data) if callable(new) else new
            zout.writestr(name, data)
    return dst


def _pt_with_pickle(tmp_path, payload, name="evil.pt"):
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("evil/data.pkl", payload)
        archive.writestr("evil/byteorder", "little")
        archive.writestr("evil/version", "3\n")
    return path


@pytest.mark.parametrize("tensor", [
    torch.randn(3, 4),
    torch.randn(5).to(torch.float16),
    torch.arange(-6, 6, dtype=torch.int64).reshape(3, 4),
    torch.tensor([True, False, True]),
    torch.randn(2, 3, dtype=torch.complex64),
    torch.randn(4, dtype=torch.float64),
    torch.arange(-5, 5, dtype=torch.int8),
    torch.arange(0, 250, 7, dtype=torch.uint8),
    torch.arange(10, dtype=torch.int32),
    torch.arange(10, dtype=torch.int16),
    torch.randn(2, 2, dtype=torch.complex128),
], ids=lambda t: str(t.dtype))
def test_pt_dtypes_round_trip(tmp_path, tensor):
    loaded = load_tensor_file(_save_pt(tmp_path, tensor))
    assert isinstance(loaded, LoadedTensor)
    assert loaded.dtype == str(tensor.dtype)
    assert loaded.array.dtype == tensor.numpy().dtype
    np.testing.assert_array_equal(loaded.array, tensor.numpy())


def test_pt_bfloat16_is_exact_float32(tmp_path):
    arr = np.array([[1.0, -2.5, 3.14159, 1e-30], [65504.0, 3e38, -0.0, 7.0]], dtype=np.float32)
    tensor = torch.tensor(arr).to(torch.bfloat16)
    loaded = load_tensor_file(_save_pt(tmp_path, tensor))
    assert loaded.dtype == "torch.bfloat16"
    assert loaded.array.dtype == np.float32
    expected = tensor.to(torch.float32).numpy()
    assert np.array_equal(loaded.array, expected)
    assert np.array_equal(np.signbit(loaded.array), np.signbit(expected))


def test_pt_bfloat16_special_values(tmp_path):
    tensor = torch.tensor([float("inf"), float("-inf"), float("nan")], dtype=torch.bfloat16)
    loaded = load_tensor_file(_save_pt(tmp_path, tensor))
    np.testing.assert_array_equal(loaded.array, tensor.float().numpy())


def test_pt_zero_dim(tmp_path):
    loaded = load_tensor_file(_save_pt(tmp_path, torch.tensor(2.5)))
    assert loaded.array.shape == ()
    assert loaded.array == np.float32(2.5)


@pytest.mark.parametrize("tensor", [torch.empty(0), torch.empty(3, 0, 2, dtype=torch.int64),
                                    torch.empty(0, dtype=torch.bfloat16)], ids=str)
def test_pt_empty(tmp_path, tensor):
    loaded = load_tensor_file(_save_pt(tmp_path, tensor))
    assert loaded.array.shape == tuple(tensor.shape)
    assert loaded.dtype == str(tensor.dtype)


@pytest.mark.parametrize("make_view", [
    lambda t: t[:, ::2],
    lambda t: t.t(),
    lambda t: t[3:],
    lambda t: t[1:, 2:5:2].t(),
    lambda t: t[2, 1],
], ids=["every-other-column", "transpose", "storage-offset", "offset-and-strides", "zero-dim-offset"])
def test_pt_views(tmp_path, make_view):
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    view = make_view(base)
    loaded = load_tensor_file(_save_pt(tmp_path, view))
    assert loaded.array.shape == tuple(view.shape)
    np.testing.assert_array_equal(loaded.array, view.numpy())
    assert loaded.array.flags.writeable  # a copy, not a view of the archive bytes


def test_pt_bfloat16_view(tmp_path):
    view = torch.randn(4, 6).to(torch.bfloat16)[1:, ::3]
    loaded = load_tensor_file(_save_pt(tmp_path, view))
    np.testing.assert_array_equal(loaded.array, view.float().numpy())


def test_pt_parameter_and_requires_grad(tmp_path):
    param = torch.nn.Parameter(torch.randn(2, 3))
    loaded = load_tensor_file(_save_pt(tmp_path, param, "p.pt"))
    np.testing.assert_array_equal(loaded.array, param.detach().numpy())
    grad = torch.randn(3, requires_grad=True)
    loaded = load_tensor_file(_save_pt(tmp_path, grad, "g.pt"))
    np.testing.assert_array_equal(loaded.array, grad.detach().numpy())


def test_pt_big_endian_byteorder_record(tmp_path):
    tensor = torch.randn(2, 3)
    src = _save_pt(tmp_path, tensor)
    dst = _rewrite_archive(src, tmp_path / "big.pt", {
        "/byteorder": b"big",
        "/data/0": lambda raw: np.frombuffer(raw, "<f4").astype(">f4").tobytes(),
    })
    np.testing.assert_array_equal(load_tensor_file(dst).array, tensor.numpy())


def test_pt_without_byteorder_record_is_little_endian(tmp_path):
    tensor = torch.arange(5, dtype=torch.int64)
    src = _save_pt(tmp_path, tensor)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp_path / "old.pt", "w") as zout:
        for name in zin.namelist():
            if not name.endswith("/byteorder"):
                zout.writestr(name, zin.read(name))
    np.testing.assert_array_equal(load_tensor_file(tmp_path / "old.pt").array, tensor.numpy())


def test_pt_malicious_reduce_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    for protocol in (2, pickle.HIGHEST_PROTOCOL):  # GLOBAL and STACK_GLOBAL opcodes
        path = _pt_with_pickle(tmp_path, pickle.dumps(Evil(), protocol=protocol))
        with pytest.raises(DumpFormatError, match="refusing to load global") as info:
            load_tensor_file(path)
        assert str(path) in str(info.value)
        assert not marker.exists()


def test_pt_malicious_payload_is_live(tmp_path):
    """Guards the test above: the same kind of payload does run under a plain pickle.loads."""
    marker = tmp_path / "control"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    pickle.loads(pickle.dumps(Evil(), protocol=2))
    assert marker.exists()


def test_pt_other_global_refused(tmp_path):
    path = _pt_with_pickle(tmp_path, pickle.dumps({"a": np.zeros(2)}, protocol=2))
    with pytest.raises(DumpFormatError, match="refusing to load global"):
        load_tensor_file(path)


def test_pt_non_tensor_pickle(tmp_path):
    path = _pt_with_pickle(tmp_path, pickle.dumps([1, 2, 3], protocol=2))
    with pytest.raises(DumpFormatError, match="not a single tensor"):
        load_tensor_file(path)


def test_pt_geometry_past_storage_is_refused(tmp_path):
    src = _save_pt(tmp_path, torch.arange(7.0))

    def widen_stride(pkl):
        assert pkl.count(b"K\x01\x85q\x07") == 1  # stride (1,) -> (2,): last element would be at 12 of 7
        return pkl.replace(b"K\x01\x85q\x07", b"K\x02\x85q\x07")

    dst = _rewrite_archive(src, tmp_path / "wide.pt", {"/data.pkl": widen_stride})
    with pytest.raises(DumpFormatError, match="exceeds its storage"):
        load_tensor_file(dst)


def test_pt_short_storage_record(tmp_path):
    src = _save_pt(tmp_path, torch.arange(7.0))
    dst = _rewrite_archive(src, tmp_path / "short.pt", {"/data/0": lambda raw: raw[:-4]})
    with pytest.raises(DumpFormatError, match="short.pt"):
        load_tensor_file(dst)


@pytest.mark.parametrize("keep", [0.3, 0.9])
def test_pt_truncated(tmp_path, keep):
    src = _save_pt(tmp_path, torch.randn(64, 64))
    data = src.read_bytes()
    bad = tmp_path / "trunc.pt"
    bad.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(DumpFormatError, match="trunc.pt"):
        load_tensor_file(bad)


def test_pt_not_a_zip(tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(b"this is not a zip archive")
    with pytest.raises(DumpFormatError, match="junk.pt"):
        load_tensor_file(path)


def test_pt_zip_without_data_pkl(tmp_path):
    path = tmp_path / "empty.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x/version", "3\n")
    with pytest.raises(DumpFormatError, match="data.pkl"):
        load_tensor_file(path)


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("array", [
    np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32),
    np.arange(10, dtype=np.int64),
    np.array(3.5),
    np.zeros((0, 3), dtype=np.float16),
    np.array([True, False]),
], ids=["float32", "int64", "zero-dim", "empty", "bool"])
def test_npy_round_trip(tmp_path, array, mmap):
    path = tmp_path / "a.npy"
    save_npy(path, array)
    loaded = load_tensor_file(path, mmap=mmap)
    assert loaded.dtype == array.dtype.name
    assert loaded.array.shape == array.shape
    np.testing.assert_array_equal(loaded.array, array)
    assert [p.name for p in tmp_path.iterdir()] == ["a.npy"]  # no temp file left behind


def test_save_npy_replaces_existing_and_keeps_name(tmp_path):
    path = tmp_path / "out.data"
    save_npy(path, np.ones(3))
    save_npy(path, np.arange(4))
    np.testing.assert_array_equal(np.load(path), np.arange(4))
    assert [p.name for p in tmp_path.iterdir()] == ["out.data"]


def test_save_npy_refuses_objects_and_cleans_up(tmp_path):
    with pytest.raises(ValueError):
        save_npy(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object))
    assert list(tmp_path.iterdir()) == []


def test_npy_garbage(tmp_path):
    path = tmp_path / "garbage.npy"
    path.write_bytes(b"\x00\x01not numpy at all" * 10)
    for mmap in (True, False):
        with pytest.raises(DumpFormatError, match="garbage.npy"):
            load_tensor_file(path, mmap=mmap)


def test_npy_truncated(tmp_path):
    path = tmp_path / "cut.npy"
    np.save(path, np.arange(1000, dtype=np.float64))
    path.write_bytes(path.read_bytes()[:500])
    for mmap in (True, False):
        with pytest.raises(DumpFormatError, match="cut.npy"):
            load_tensor_file(path, mmap=mmap)


def test_npy_pickled_object_array_refused(tmp_path):
    path = tmp_path / "obj.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DumpFormatError, match="obj.npy"):
        load_tensor_file(path, mmap=False)


def test_npz_named_npy_refused(tmp_path):
    path = tmp_path / "archive.npy"
    with open(path, "wb") as file:
        np.savez(file, a=np.zeros(2))
    with pytest.raises(DumpFormatError, match="magic"):
        load_tensor_file(path)


def test_missing_file(tmp_path):
    for name in ("absent.npy", "absent.pt"):
        with pytest.raises(DumpFormatError, match="no such file"):
            load_tensor_file(tmp_path / name)


def test_unknown_suffix(tmp_path):
    path = tmp_path / "t.bin"
    path.write_bytes(b"1234")
    with pytest.raises(DumpFormatError, match=r"expected \.npy or \.pt"):
        load_tensor_file(path)


def test_error_messages_are_one_line(tmp_path):
    path = tmp_path / "bad.pt"
    path.write_bytes(b"PK\x03\x04 garbage")
    with pytest.raises(DumpFormatError) as info:
        load_tensor_file(path)
    assert "\n" not in str(info.value)


def test_module_does_not_import_torch():
    code = "import sys, msprobe.core.dump.tensor_files; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4), np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    np.arange(24, dtype=np.int64).reshape(4, 6)[:, ::2], np.array(2.5), np.zeros((0, 3), np.float16),
    np.arange(6, dtype=np.uint16), np.array([True, False]), np.arange(4, dtype=np.complex64)],
    ids=["c", "fortran", "strided", "0-d", "empty", "uint16", "bool", "complex"])
def test_write_npy_writes_the_bytes_np_save_writes_for_a_c_ordered_array(tmp_path, array):
    """The dump's .npy files: numpy's own writer, always C order (a Fortran array too), byte for byte
    what np.save writes of the array in C order."""
    write_npy(str(tmp_path / "a.npy"), array)
    np.save(tmp_path / "b.npy", np.array(array, order="C"))
    assert (tmp_path / "a.npy").read_bytes() == (tmp_path / "b.npy").read_bytes()
    assert oct(os.stat(tmp_path / "a.npy").st_mode & 0o777) == "0o640"

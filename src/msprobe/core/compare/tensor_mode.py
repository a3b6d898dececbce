"""Real-data (tensor) compare: load each pair of saved tensors and compute the metrics of
`metrics.py`, streaming (memory-mapped .npy, float64 chunks) in parallel worker processes.

Guarded by `benchmarks/compare_throughput.py`. Must not import torch or mindspore.
"""
from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from msprobe.core.compare.columns import TENSOR_METRICS
from msprobe.core.compare.metrics import tensor_metrics
from msprobe.core.dump.tensor_files import load_tensor_file
from msprobe.core.errors import MsprobeError

UNSUPPORTED = "unsupported"
UNREADABLE = "tensor file unreadable"  # such a row's Result is N/A: nothing was compared
# below this many bytes in all, starting worker processes costs more than it saves
PARALLEL_MIN_BYTES = 64 << 20


def _one_pair(task):
    """(row, metrics tuple or None, message) for one (row, target file, golden file) task."""
    row, t_path, g_path = task
    try:
        t = load_tensor_file(t_path).array
        g = load_tensor_file(g_path).array
    except MsprobeError as e:
        return row, None, f"{UNREADABLE}: {e}"
    if t.shape != g.shape:
        return row, None, f"shapes of the saved tensors differ: {list(t.shape)} vs {list(g.shape)}"
    if t.dtype.kind not in "biufc" or g.dtype.kind not in "biufc":
        return row, None, f"tensor dtype not comparable: {t.dtype} vs {g.dtype}"
    if t.dtype.kind == "c" or g.dtype.kind == "c":  # complex: compare magnitudes
        t, g = np.abs(t), np.abs(g)
    m = tensor_metrics(t, g)
    return row, (m.cosine, m.euc_dist, m.max_abs_err, m.max_rel_err, m.one_thousandth, m.five_thousandths,
                 t.size, m.nonfinite_moved), m.message


def _file_size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


@contextlib.contextmanager
def _single_threaded_blas():
    """Workers started meanwhile get one BLAS thread each: the processes are the parallelism, and
    BLAS threads spinning next to them only steal the cores (environment read at numpy import)."""
    names = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {n: os.environ.get(n) for n in names}
    for n in names:
        os.environ.setdefault(n, "1")
    try:
        yield
    finally:
        for n, v in saved.items():
            if v is None:
                os.environ.pop(n, None)


def _run_tasks(tasks, workers, progress):
    from tqdm import tqdm
    total = sum(_file_size(t) + _file_size(g) for _, t, g in tasks)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="compare tensors", disable=not progress,
               leave=False)
    sizes = {row: _file_size(t) + _file_size(g) for row, t, g in tasks}
    try:
        if workers <= 1 or total < PARALLEL_MIN_BYTES or len(tasks) < 2:
            for task in tasks:
                out = _one_pair(task)
                bar.update(sizes[task[0]])
                yield out
            return
        # big tensors first so the workers finish together
        tasks = sorted(tasks, key=lambda t: -sizes[t[0]])
        # fork: spawned workers would re-run the caller's __main__ script (no main guard in a notebook
        # or training script); the metrics use no BLAS, so the parent's BLAS threads do not matter
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with _single_threaded_blas(), ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
            for out in pool.map(_one_pair, tasks, chunksize=1):
                bar.update(sizes[out[0]])
                yield out
    finally:
        bar.close()


def tensor_dir(reader):
    """The folder of a dump's tensor files: the one next to dump.json first (a copied or moved dump
    still names its old place in dump_data_dir), else dump_data_dir."""
    local = os.path.join(reader.rank_dir, "dump_tensor_data")
    if os.path.isdir(local) or not reader.dump_data_dir or not os.path.isdir(reader.dump_data_dir):
        return local
    return reader.dump_data_dir


def _plain_name(name, reader):
    """A file name in the tensor folder, or a tensor shards.py assembled for a merged side."""
    if not isinstance(name, str):
        return False
    assembled = getattr(reader, "assembled_dir", None)
    if assembled and os.path.dirname(name) == os.path.abspath(assembled):
        return True
    return os.path.basename(name) == name and name not in (".", "..")


def default_workers():
    return max(1, min(os.cpu_count() or 1, 8))


def compute_tensor_metrics(target, golden, gidx, t_reader, g_reader, *, workers=None, progress=True):
    """Metric arrays and display cells for every target row.

    Returns:
        dict: float arrays cosine, euc, max_abs, max_rel, one_k, five_k; "display" (column -> object
        array for the table); "messages" (object array of per-row notes); "nonfinite_moved" (bool
        array: both tensors hold inf/nan, at different elements); "unreadable" (bool array: a tensor
        file of the row could not be read, or is inconsistent); "one_element" (bool array: tensors of
        at most one element, whose Cosine, EucDist and ratios the table shows as unsupported).
    """
    n = len(target)
    arrays = {k: np.full(n, np.nan) for k in ("cosine", "euc", "max_abs", "max_rel", "one_k", "five_k")}
    display = {c: np.full(n, "N/A", dtype=object) for c in TENSOR_METRICS}
    messages = np.full(n, "", dtype=object)
    nonfinite_moved = np.zeros(n, dtype=bool)
    one_element = np.zeros(n, dtype=bool)
    t_kind = target["kind"].to_numpy(dtype=object)
    g_kind = np.full(n, None, dtype=object)
    matched = gidx >= 0
    g_kind[matched] = golden["kind"].to_numpy(dtype=object)[gidx[matched]]
    t_files = target["data_name"].to_numpy(dtype=object)
    g_files = np.full(n, None, dtype=object)
    g_files[matched] = golden["data_name"].to_numpy(dtype=object)[gidx[matched]]

    not_tensor = matched & ((t_kind != "tensor") | (g_kind != "tensor"))
    for c in TENSOR_METRICS:
        display[c][not_tensor] = UNSUPPORTED
    t_dir, g_dir = tensor_dir(t_reader), tensor_dir(g_reader)
    unreadable = np.zeros(n, dtype=bool)
    tasks = []
    for i in np.flatnonzero(matched & ~not_tensor):
        if not t_files[i] or not g_files[i]:
            messages[i] = "no saved tensor on " + ("either side" if not t_files[i] and not g_files[i]
                                                   else "the target side" if not t_files[i] else "the golden side")
            continue
        odd = [name for name, r in ((t_files[i], t_reader), (g_files[i], g_reader)) if not _plain_name(name, r)]
        if odd:  # a name reaching outside the tensor folder ("../x", "/etc/x") is not followed
            messages[i], unreadable[i] = f"{UNREADABLE}: data_name {odd[0]!r} is not a file name", True
            continue
        tasks.append((int(i), os.path.join(t_dir, t_files[i]), os.path.join(g_dir, g_files[i])))
    for row, values, message in _run_tasks(tasks, workers or default_workers(), progress):
        if message:
            messages[row] = message
        if values is None:
            unreadable[row] = message.startswith(UNREADABLE)
            continue
        cos, euc, mx_abs, mx_rel, one_k, five_k, size, moved = values
        nonfinite_moved[row] = moved
        for k, v in zip(("cosine", "euc", "max_abs", "max_rel", "one_k", "five_k"), values[:6]):
            arrays[k][row] = v
        cells = [cos, euc, mx_abs, mx_rel, one_k, five_k]
        if size <= 1:  # one element: only the absolute and relative errors mean anything
            cells = [UNSUPPORTED, UNSUPPORTED, mx_abs, mx_rel, UNSUPPORTED, UNSUPPORTED]
            one_element[row] = True
            arrays["cosine"][row] = arrays["one_k"][row] = np.nan
            messages[row] = ""
        for c, v in zip(TENSOR_METRICS, cells):
            display[c][row] = v if not (isinstance(v, float) and math.isnan(v)) else "N/A"
    return {**arrays, "display": display, "messages": messages, "nonfinite_moved": nonfinite_moved,
            "unreadable": unreadable, "one_element": one_element}

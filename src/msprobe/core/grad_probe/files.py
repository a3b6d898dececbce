"""grad_probe output files: layout, summary CSV columns, direction bitmaps.

    dump_path/rank{R}/grad_summary_{S}.csv     one row per parameter: statistics (+ MD5 at L0,
                                               + interval shares at L2)
    dump_path/rank{R}/step{S}/{param}.npy      direction (L1, L2): the sign bitmap "gradient > 0",
                                               packed 8 elements per byte (np.packbits, uint8)

msProbe's grad_probe saved the bitmap unpacked (a bool array shaped like the parameter); the reader
takes both. Must not import torch or mindspore.
"""

import csv
import io
import json
import os
import re

import numpy as np

from msprobe.core.errors import DumpFormatError
from msprobe.core.file_limits import check_regular, read_bytes

_SUMMARY_RE = re.compile(r"^grad_summary_(\d+)\.csv$")
_RANK_RE = re.compile(r"^rank(\d+)$")
STAT_COLUMNS = ("Max", "Min", "Norm")


def interval_labels(bounds):
    """Column names of the L2 distribution: (-inf, b0], (b0, b1], ..., (bn, inf), then =0."""
    edges = ["-inf", *(f"{b:g}" for b in bounds), "inf"]
    labels = [f"({lo}, {hi}]" for lo, hi in zip(edges[:-2], edges[1:-1])]
    return labels + [f"({edges[-2]}, inf)", "=0"]


def summary_header(level, bounds):
    head = ["Param_name"]
    if level == "L0":
        head.append("MD5")
    if level == "L2":
        head.extend(interval_labels(bounds))
    return head + list(STAT_COLUMNS) + ["Shape"]


def rank_dir(dump_path, rank):
    return os.path.join(dump_path, f"rank{rank}")


def summary_path(dump_path, rank, step):
    return os.path.join(rank_dir(dump_path, rank), f"grad_summary_{step}.csv")


def direction_path(dump_path, rank, step, param):
    return os.path.join(rank_dir(dump_path, rank), f"step{step}", param.replace(os.sep, "_") + ".npy")


def write_summary(path, header, rows):
    """Write one step's CSV; rows are lists in header order. Written to a temp name, then renamed."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    os.replace(tmp, path)


def write_direction(path, bits):
    """Save a packed sign bitmap (uint8 from np.packbits). Written in place: a step is complete once its
    grad_summary CSV exists, which is written after its bitmaps and renamed into place."""
    np.save(path, bits, allow_pickle=False)


def find_grad_ranks(root):
    """{rank: rank_dir} of a grad_probe output (`root` may be dump_path or one rank dir).

    Raises:
        DumpFormatError: no grad_summary_*.csv below `root`.
    """
    root = os.path.abspath(root)
    if os.path.isdir(root) and any(_SUMMARY_RE.match(f) for f in os.listdir(root)):
        m = _RANK_RE.match(os.path.basename(root))
        return {int(m.group(1)) if m else 0: root}
    found = {}
    if os.path.isdir(root):
        for d in os.listdir(root):
            m = _RANK_RE.match(d)
            path = os.path.join(root, d)
            if m and os.path.isdir(path) and any(_SUMMARY_RE.match(f) for f in os.listdir(path)):
                found[int(m.group(1))] = path
    if not found:
        raise DumpFormatError(f"'{root}': no grad_probe output found; expected rank{{R}}/grad_summary_{{S}}.csv")
    return dict(sorted(found.items()))


def summary_steps(rank_path):
    """Sorted steps that have a grad_summary_{S}.csv in a rank dir."""
    return sorted(int(m.group(1)) for m in map(_SUMMARY_RE.match, os.listdir(rank_path)) if m)


def read_summary(rank_path, step):
    """{param: {column: value}} of one step; Shape as a list, numbers as float, MD5 as str."""
    path = os.path.join(rank_path, f"grad_summary_{step}.csv")
    try:
        text = read_bytes(path).decode("utf-8")
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DumpFormatError(f"{path}: not readable as CSV ({e})") from None
    out = {}
    for row in rows:
        name = row.get("Param_name")
        if name is None:
            raise DumpFormatError(f"{path}: no 'Param_name' column; not a grad_summary file")
        parsed = {}
        for k, v in row.items():
            if k in ("Param_name", "MD5") or v is None:
                parsed[k] = v
            elif k == "Shape":
                try:
                    parsed[k] = json.loads(v)
                except ValueError:
                    raise DumpFormatError(f"{path}: Shape {v!r} of {name} is not a list") from None
            else:
                try:
                    parsed[k] = float(v)
                except ValueError:
                    raise DumpFormatError(f"{path}: column {k!r} of {name} is {v!r}, not a number") from None
        out[name] = parsed
    return out


def load_direction(rank_path, step, param, numel):
    """The sign bitmap of `param` at `step`, packed (uint8, numel bits); None when the file is absent.

    Accepts our packed files and msProbe's unpacked bool arrays.
    """
    path = os.path.join(rank_path, f"step{step}", param.replace(os.sep, "_") + ".npy")
    if not os.path.lexists(path):
        return None
    check_regular(path)
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DumpFormatError(f"{path}: not a .npy bitmap ({e})") from None
    if arr.dtype == np.bool_:
        if arr.size != numel:
            raise DumpFormatError(f"{path}: {arr.size} elements, the summary's Shape says {numel}")
        return np.packbits(arr.reshape(-1))
    if arr.dtype != np.uint8 or arr.ndim != 1 or arr.size != (numel + 7) // 8:
        raise DumpFormatError(f"{path}: expected {(numel + 7) // 8} packed bytes (uint8) for {numel} "
                              f"elements, got {arr.dtype} {list(arr.shape)}")
    return arr

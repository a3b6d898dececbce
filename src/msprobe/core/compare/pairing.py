"""Which target directory is compared with which golden one: files, rank dirs, step dirs, dump roots.

Ranks pair by number within a step; N rank dirs against one (a sharded run against a single-device
run) pair as one side to merge (core/compare/shards.py); two sides of one step each pair whatever their
step numbers.
Dumps made without a process group are named `proc{pid}`, and every run into the same dump_path adds
one: a step holding several is several runs (or processes) whose ids say nothing across sides. They
pair by time, the newest with the newest, and the choice is said in one line; `--target-run` and
`--golden-run` pick others (`all`: every one, in time order). Must not import torch or mindspore.
"""
from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass

from msprobe.core.dump.reader import find_rank_dirs
from msprobe.core.errors import MsprobeError

log = logging.getLogger(__name__)
_STEP_RANK = re.compile(r"step(\d+)[/\\](rank|proc)(\d+)$")
ALL_RUNS = "all"


@dataclass(frozen=True)
class Side:
    """One side of a pair: a dump.json/debug.json path, a rank dir, or a tuple of rank dirs (a sharded run
    to merge into one side, core/compare/shards.py), and where it sits."""

    path: str | tuple
    step: int | None
    rank: int | None
    is_proc: bool = False


@dataclass(frozen=True)
class Pair:
    target: Side
    golden: Side
    note: str | None = None   # how a run was chosen among several, in one line


def _file_side(path):
    m = _STEP_RANK.search(os.path.dirname(os.path.abspath(path)))
    if m:
        return Side(path, int(m.group(1)), int(m.group(3)), m.group(2) == "proc")
    return Side(path, 0, 0)  # a file outside step{N}/rank{R}: one step, one rank


def pair_inputs(target_path, golden_path, target_run=None, golden_run=None):
    """[Pair] for two files, two rank dirs, two step dirs or two dump roots.

    Args:
        target_run, golden_run: among several `proc{pid}` runs of a step, the one to compare ("proc4242"
            or "4242"), or "all" to pair them all in time order. Defaults to the newest of each side.

    Raises:
        MsprobeError: a path is missing, the two are of different kinds, nothing pairs, or a named run
            is not there (the message lists the runs).
    """
    for p, what in ((target_path, "target"), (golden_path, "golden")):
        if not os.path.exists(p):
            raise MsprobeError(f"{what} path '{p}' does not exist")
    if os.path.isfile(target_path) != os.path.isfile(golden_path):
        raise MsprobeError(f"give two dump.json files or two directories; got '{target_path}' and '{golden_path}'")
    if os.path.isfile(target_path):
        return [Pair(_file_side(target_path), _file_side(golden_path))]
    t_steps, g_steps = _by_step(find_rank_dirs(target_path)), _by_step(find_rank_dirs(golden_path))
    if len(t_steps) == 1 and len(g_steps) == 1:
        step_pairs = [(next(iter(t_steps)), next(iter(g_steps)))]
    else:
        step_pairs = [(s, s) for s in sorted(t_steps) if s in g_steps]
        missing = sorted(set(t_steps) ^ set(g_steps))
        if missing:
            log.warning("steps present on one side only are skipped: %s", missing)
    pairs = []
    for ts, gs in step_pairs:
        tr, gr = _ranks_first(t_steps[ts]), _ranks_first(g_steps[gs])
        if all(d.is_proc for d in tr + gr) or (len(tr) == 1 and len(gr) == 1):
            pairs += _pair_runs(ts, tr, gr, target_run, golden_run)
            continue
        if len(gr) == 1 and not tr[0].is_proc:  # N ranks against one process: merged into one side
            pairs.append(Pair(_merged_side(tr), _dir_side(gr[0])))
            continue
        if len(tr) == 1 and not gr[0].is_proc:
            pairs.append(Pair(_dir_side(tr[0]), _merged_side(gr)))
            continue
        g_by_rank = {d.rank: d for d in gr}
        for d in tr:
            if d.rank in g_by_rank:
                pairs.append(Pair(_dir_side(d), _dir_side(g_by_rank[d.rank])))
            else:
                log.warning("step %s rank %s: no golden rank directory; skipped", ts, d.rank)
    if not pairs:
        raise MsprobeError(f"no step/rank directories pair up between '{target_path}' and '{golden_path}'")
    return pairs


def _pair_runs(step, t_dirs, g_dirs, target_run, golden_run):
    """Pairs of one step whose dirs are processes (or one dir a side): newest with newest unless told."""
    t_sel = _choose(t_dirs, target_run, "--target-run", step)
    g_sel = _choose(g_dirs, golden_run, "--golden-run", step)
    if len(t_sel) != len(g_sel):
        log.warning("step %s: %d target and %d golden runs; pairing the first %d in time order",
                    step, len(t_sel), len(g_sel), min(len(t_sel), len(g_sel)))
    note = None
    if len(t_dirs) > 1 or len(g_dirs) > 1:
        chosen = ", ".join(f"target {_name(a)} with golden {_name(b)}" for a, b in zip(t_sel, g_sel))
        how = "as asked" if target_run or golden_run else "the newest with the newest"
        note = (f"step {step}: target holds {_runs_text(t_dirs)}, golden {_runs_text(g_dirs)}; comparing {chosen} "
                f"({how}; choose with --target-run/--golden-run NAME, or 'all')")
    return [Pair(_dir_side(a), _dir_side(b), note) for a, b in zip(t_sel, g_sel)]


def _choose(dirs, wanted, flag, step):
    by_time = sorted(dirs, key=_mtime)
    if wanted is None:
        return by_time[-1:]
    if wanted == ALL_RUNS:
        return by_time
    name = wanted if str(wanted).startswith(("proc", "rank")) else f"proc{wanted}"
    hit = [d for d in dirs if _name(d) == name]
    if not hit:
        raise MsprobeError(f"{flag} '{wanted}': no such run in step {step}; runs there: {_runs_text(dirs)}; "
                           f"allowed: one of those names, or '{ALL_RUNS}'")
    return hit


def _name(d):
    return os.path.basename(d.path)


def _mtime(d):
    f = os.path.join(d.path, "dump.json")
    f = f if os.path.isfile(f) else os.path.join(d.path, "debug.json")
    try:
        return os.path.getmtime(f)
    except OSError:
        return 0.0


def _runs_text(dirs):
    if len(dirs) == 1:
        return f"1 run ({_name(dirs[0])})"
    items = ", ".join(f"{_name(d)} {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(_mtime(d)))}"
                      for d in sorted(dirs, key=_mtime))
    return f"{len(dirs)} runs ({items})"


def _ranks_first(dirs):
    """rank{R} dirs when a step has any: proc{pid} dirs next to them are helper processes."""
    ranks = [d for d in dirs if not d.is_proc]
    return ranks or dirs


def _by_step(dirs):
    steps = {}
    for d in dirs:
        steps.setdefault(d.step, []).append(d)
    return steps


def _dir_side(d):
    return Side(d.path, d.step, d.rank, d.is_proc)


def _merged_side(dirs):
    dirs = sorted(dirs, key=lambda d: d.rank)
    return Side(tuple(d.path for d in dirs), dirs[0].step, dirs[0].rank)

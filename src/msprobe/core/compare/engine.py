"""compare_dumps: pair the step/rank directories of two dumps, detect the mode, match rows and build
one result table per pair. The public Python entry point of `msprobe compare`.

Must not import torch or mindspore; pandas is imported inside the functions that need it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field

from msprobe.core.compare import mappings
from msprobe.core.checksum import checksum_kind
from msprobe.core.compare.matching import MatchOptions, match_rows
from msprobe.core.compare.pairing import pair_inputs
from msprobe.core.dump.reader import DumpReader
from msprobe.core.errors import DumpFormatError, MsprobeError, where
from msprobe.core.gc_pause import CollectorPause

log = logging.getLogger(__name__)
MODES = ("tensor", "statistics", "md5", "structure")


@dataclass
class CompareResult:
    """The comparison of one target rank directory with one golden rank directory.

    Attributes:
        step, rank: from the directory names (0 and 0 for a file outside step{N}/rank{R} dirs).
        mode: "tensor", "statistics", "md5" or "structure".
        table: pandas.DataFrame, one row per target tensor, msProbe's columns (facts §8.5).
        target_dir, golden_dir: the two rank directories.
        target_framework, golden_framework: from dump.json.
        is_proc: the rank number is a process id (dumps made without a process group).
        merged_ranks: the number of rank dirs merged into one side (a sharded run against a
            single-device run), else None.
        merge_note: what merging a data-parallel run's ranks assumed (one line), or None.
        merge_unequal: those ranks held unequal parts of the batch.
        seconds: wall seconds of each phase: "read" (parse and flatten both dumps), "match",
            "metrics" (tensor mode) and "table".
        pairing: how this pair's runs were chosen among several proc{pid} runs of its step (one line),
            or None.
        rows: the typed rows the table shows (`frame.PairedRows`): what the diagnosis reads.
        stacks: target call key -> stack lines ({} without stack.json).
        construct: the target's construct.json (node -> parent module; {} at L1).
        counts, row_count: rows per Result value and rows in all, once written by `write_compare`
            (which may drop the table, rows, stacks and construct of a many-rank compare).
    """

    step: int | None
    rank: int | None
    mode: str
    table: object
    target_dir: str
    golden_dir: str
    target_framework: str | None = None
    golden_framework: str | None = None
    is_proc: bool = False
    output_path: str | None = field(default=None)
    seconds: dict = field(default_factory=dict)
    pairing: str | None = None
    rows: object = None
    stacks: dict = field(default_factory=dict)
    construct: dict = field(default_factory=dict)
    merged_ranks: int | None = None
    merge_note: str | None = None
    merge_unequal: bool = False
    counts: dict | None = None
    row_count: int | None = None

    def __bool__(self):
        """True when no row is an error."""
        verdicts = getattr(self.rows, "verdicts", None)
        if verdicts is None:  # rows let go once written: their counts stay
            return not (self.counts or {}).get("error")
        return not verdicts.any_error


def detect_mode(t_reader, g_reader, t_rows, g_rows):
    """The compare mode from both dumps' task (and md5 fields); different tasks are an error."""
    tasks = (t_reader.task or "statistics", g_reader.task or "statistics")
    if tasks[0] != tasks[1]:
        raise MsprobeError(f"the dumps were made with different tasks: target '{tasks[0]}' "
                           f"({t_reader.dump_file}), golden '{tasks[1]}' ({g_reader.dump_file}); "
                           "dump both with the same task")
    task = tasks[0]
    if task == "tensor":
        return "tensor"
    if task == "structure":
        return "structure"
    if task == "statistics" and any(t_rows["md5"]) and any(g_rows["md5"]):
        kinds = (_checksum_kinds(t_rows["md5"]), _checksum_kinds(g_rows["md5"]))
        if kinds[0] == kinds[1]:
            return "md5"
        # CRC-32 against an older msprobe dump's 16-digit checksum: not one row could match
        _warn_other_hash("/".join(sorted(kinds[0])), "/".join(sorted(kinds[1])))
    if task not in MODES:
        raise MsprobeError(f"{t_reader.dump_file}: task '{task}' cannot be compared; "
                           f"allowed: {', '.join(MODES)}")
    return "statistics"


@functools.lru_cache(maxsize=None)  # once per compare_dumps (per pair of hashes), not once per rank
def _warn_other_hash(target, golden):
    log.warning("md5: the checksums were made by different hashes (target: %s, golden: %s) and cannot be "
                "compared; comparing the statistics both dumps hold instead", target, golden)


def _checksum_kinds(values):
    return {checksum_kind(v) for v in values if isinstance(v, str)} - {None}


# dump.json files above this size are read in a second process while this one reads the other side
PARALLEL_LOAD_BYTES = 32 << 20


def _load_side(path):
    """(DumpReader without its records, row table) of one dump; the records are dropped once flat.
    Without cyclic collection meanwhile: the dump's millions of fresh dicts and lists hold no cycles,
    yet each collection walked them all (more than half the load time of a million-record dump)."""
    with CollectorPause():
        return _read_and_flatten(path)


def _load_side_packed(path):
    """`_load_side` in a worker process: its row table packed for a fast trip back."""
    from msprobe.core.compare.rows import packed_frame
    reader, frame = _load_side(path)
    return reader, packed_frame(frame)


def _read_and_flatten(path):
    from msprobe.core.compare.rows import frame_from_records
    reader = DumpReader(path)
    if reader.task == "structure" and not reader.data:
        from msprobe.core.compare.rows import frame_from_construct
        frame = frame_from_construct(reader.construct)
    else:
        frame = frame_from_records(reader.data)
    reader.data = {}
    return reader, frame


def _load_sides(target_path, golden_path):
    """Both sides' (reader, rows); the golden side in a worker process when the files are large."""
    if _json_size(target_path) + _json_size(golden_path) < PARALLEL_LOAD_BYTES or (os.cpu_count() or 1) < 2:
        return _load_side(target_path), _load_side(golden_path)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    ctx = multiprocessing.get_context("fork") if hasattr(os, "fork") else None
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        golden = pool.submit(_load_side_packed, golden_path)
        target = _load_side(target_path)
        g_reader, g_packed = golden.result()
    from msprobe.core.compare.rows import unpacked_frame
    return target, (g_reader, unpacked_frame(g_packed))


@dataclass
class CompareOptions:
    """Everything compare_dumps needs besides the two paths (see its docstring)."""

    fuzzy_match: bool = False
    data_mapping: str | dict | None = None
    cell_mapping: str | dict | None = None
    api_mapping: str | bool | None = None
    layer_mapping: str | dict | None = None
    stack: bool = True
    stack_path: str | None = None
    progress: bool = True
    workers: int | None = None


def _mapping(value, loader):
    if value is None or value is False:
        return {}
    return dict(value) if isinstance(value, dict) else loader(value)


@dataclass(frozen=True)
class _LoadedMappings:
    data: dict
    cell: dict
    layer: dict
    api_file: str | None


def _load_mappings(opts):
    """Read and validate the mapping files before any dump is loaded: a bad file fails fast."""
    api_file = opts.api_mapping if isinstance(opts.api_mapping, str) else None
    if api_file:
        mappings.load_api_mapping(api_file)
    return _LoadedMappings(data=_mapping(opts.data_mapping, mappings.load_data_mapping),
                           cell=_mapping(opts.cell_mapping, mappings.load_cell_mapping),
                           layer=_mapping(opts.layer_mapping, mappings.load_layer_mapping),
                           api_file=api_file)


def dump_size(side):
    """Bytes of dump.json of a pair's side (all its rank dirs when merged)."""
    return sum(map(_json_size, side.path if isinstance(side.path, tuple) else (side.path,)))


def _json_size(path):
    """Bytes of a dump.json/debug.json file, or of a rank dir's dump.json (0 when there is none)."""
    f = path if os.path.isfile(path) else os.path.join(path, "dump.json")
    return os.path.getsize(f) if os.path.isfile(f) else 0


def compare_pair(target, golden, opts, maps=None):
    """CompareResult of one target rank dir/file against one golden rank dir/file."""
    from tqdm import tqdm

    from msprobe.core.compare.frame import PairedRows
    from msprobe.core.compare.table import build_table
    maps = maps or _load_mappings(opts)
    if maps.data and opts.fuzzy_match:
        raise MsprobeError("-dm/--data_mapping and -fm/--fuzzy_match cannot be combined")
    # phases of a big statistics compare take a while too: show them (tensor mode has its own bar)
    phases = tqdm(total=3, desc=f"compare step {target.step} rank {target.rank}", unit="phase", leave=False,
                  disable=not opts.progress or dump_size(target) + dump_size(golden) < PARALLEL_LOAD_BYTES)
    seconds = {}
    clock = [time.perf_counter()]

    def lap(name):
        now = time.perf_counter()
        seconds[name] = now - clock[0]
        clock[0] = now

    sharded = isinstance(target.path, tuple) or isinstance(golden.path, tuple)
    with phases, (tempfile.TemporaryDirectory(prefix="msprobe_shards_") if sharded else
                  contextlib.nullcontext()) as scratch:
        phases.set_postfix_str("reading dumps")
        if sharded:
            from msprobe.core.compare.shards import load_sharded_sides
            (t_reader, t_rows), (g_reader, g_rows) = load_sharded_sides(target.path, golden.path, scratch)
        else:
            (t_reader, t_rows), (g_reader, g_rows) = _load_sides(target.path, golden.path)
        lap("read")
        phases.update()
        mode = detect_mode(t_reader, g_reader, t_rows, g_rows)
        t_fw, g_fw = t_reader.framework, g_reader.framework
        cross = bool(t_fw and g_fw and t_fw != g_fw)
        if opts.api_mapping and t_fw == "pytorch":
            raise MsprobeError("-am/--api_mapping maps MindSpore APIs to PyTorch ones; the target dump "
                               f"{t_reader.dump_file} is a PyTorch dump")
        ms_target = (cross and t_fw == "mindspore") or bool(opts.api_mapping)
        match_opts = MatchOptions(
            # across frameworks the call sequences always differ somewhere (a Primitive where the other
            # side has a Functional, an extra cast): pairing by call index would shift every later call
            fuzzy=opts.fuzzy_match or (not maps.data and (cross or _counts_differ(t_rows, g_rows))),
            renumber_backward=not t_reader.dump_file.endswith("debug.json"),
            # with -am on MindSpore vs MindSpore-on-torch (mindtorch) names too
            cross_framework=ms_target,
            api_rules=mappings.load_api_mapping(maps.api_file) if ms_target else {},
            cell_table=mappings.load_cell_table() if ms_target else None,
            cell_mapping=maps.cell, layer_mapping=maps.layer, data_mapping=maps.data)
        phases.set_postfix_str("matching")
        gidx = match_rows(t_rows, g_rows, match_opts)
        lap("match")
        phases.update()
        stacks = _stack_of(t_reader, opts.stack_path)
        metrics = None
        if mode == "tensor":
            from msprobe.core.compare.tensor_mode import compute_tensor_metrics
            metrics = compute_tensor_metrics(t_rows, g_rows, gidx, t_reader, g_reader,
                                             workers=opts.workers, progress=opts.progress)
            lap("metrics")
        phases.set_postfix_str("result table")
        rows = PairedRows(t_rows, g_rows, gidx, metrics)
        table = build_table(rows, mode, cross_framework=cross, stack=stacks if opts.stack else None,
                            tensor_metrics=metrics)
        rows.drop_display_columns()
        lap("table")
        phases.update()
    return CompareResult(step=target.step, rank=target.rank, mode=mode, table=table,
                         target_dir=t_reader.rank_dir, golden_dir=g_reader.rank_dir,
                         target_framework=t_fw, golden_framework=g_fw, is_proc=target.is_proc, seconds=seconds,
                         rows=rows, stacks=stacks or {}, construct=t_reader.construct,
                         merged_ranks=next((len(p) for p in (target.path, golden.path)
                                            if isinstance(p, tuple)), None),
                         merge_note=getattr(t_reader, "merge_note", None) or getattr(g_reader, "merge_note", None),
                         merge_unequal=bool(getattr(t_reader, "merge_unequal", False)
                                            or getattr(g_reader, "merge_unequal", False)))


def _counts_differ(t_rows, g_rows):
    """The runs call an API a different number of times: its indices do not name the same calls."""
    from msprobe.core.compare.matching import differing_call_counts
    differ = differing_call_counts(t_rows["key"].tolist(), g_rows["key"].tolist())
    if differ:
        log.info("compare: %s is called %d times in the target and %d times in the golden run; pairing calls "
                 "by aligning the two call sequences (as -fm does)", *differ)
    return differ is not None


def _stack_of(reader, stack_path):
    """key -> stack lines of the target (from `stack_path` when given), None without stack.json."""
    if stack_path:
        from msprobe.core.dump.reader import load_stack
        return load_stack(stack_path)
    if not os.path.isfile(os.path.join(reader.rank_dir, "stack.json")):
        return None
    return reader.stack


def compare_dumps(target_path, golden_path, *, fuzzy_match=False, data_mapping=None, cell_mapping=None,
                  api_mapping=None, layer_mapping=None, stack=True, progress=True, stack_path=None,
                  workers=None, target_run=None, golden_run=None, skipped=None):
    """Compare a target dump with a golden (benchmark) dump.

    Args:
        target_path, golden_path: two dump.json/debug.json files, two rank dirs, two step dirs
            (ranks pair by number) or two dump roots (steps and ranks pair by number).
        fuzzy_match: pair calls ignoring call indices (aligns the two call sequences).
        data_mapping: YAML path or dict of full tensor names, target -> golden.
        cell_mapping: YAML path or dict of module `path.Class` (or substrings), target -> golden.
        api_mapping: True for the built-in MindSpore -> PyTorch API table, or a YAML path adding to
            it. The table is used anyway when a MindSpore target meets a PyTorch golden.
        layer_mapping: YAML path or dict `{LayerClass: {target child: golden child}}`.
        stack: attach the target's call stacks (NPU_Stack_Info) when stack.json exists.
        progress: show a tqdm bar while tensors are compared.
        stack_path: a stack.json to use instead of the one next to the target dump.
        workers: worker processes for tensor mode; defaults to the CPU count (at most 8).
        target_run, golden_run: where a step holds several `proc{pid}` runs (dumps made without a process
            group, one per run into the same dump_path): the run to compare ("proc4242"), or "all" to pair
            them all in time order. Defaults to the newest of each side; `CompareResult.pairing` says so.
        skipped: a list to collect one line per pair whose dump cannot be read, which is then skipped;
            None raises on the first one.

    Returns:
        list[CompareResult], one per (step, rank) pair, ordered by step then rank.

    Raises:
        MsprobeError: paths that do not pair up, unreadable dumps or mapping files, different tasks, a
            named run that is not there.

    Example:
        >>> from msprobe.core.compare.engine import compare_dumps
        >>> results = compare_dumps("run_bf16/dump", "run_fp32/dump")          # doctest: +SKIP
        >>> results[0].table[results[0].table["Result"] != "pass"].head()      # doctest: +SKIP
    """
    plan = compare_plan(target_path, golden_path, fuzzy_match=fuzzy_match, data_mapping=data_mapping,
                        cell_mapping=cell_mapping, api_mapping=api_mapping, layer_mapping=layer_mapping,
                        stack=stack, stack_path=stack_path, progress=progress, workers=workers,
                        target_run=target_run, golden_run=golden_run)
    from tqdm import tqdm
    results = []
    for p in tqdm(plan.pairs, desc="compare", unit="rank pair", leave=False,
                  disable=not progress or len(plan.pairs) < 2):
        try:
            results.append(plan.compare(p))
        except DumpFormatError as e:
            if skipped is None:
                raise
            side = p.target
            place = where(side.step, side.rank, side.is_proc) if side.step is not None else "dump"
            skipped.append(f"{place}: skipped: {e}")
    return results


@dataclass
class ComparePlan:
    """The pairs of a compare and what each needs (`compare_plan`); `compare(pair)` runs one."""

    pairs: list
    opts: CompareOptions
    maps: object

    def compare(self, pair, opts=None):
        if pair.note:
            log.info("%s", pair.note)
        result = compare_pair(pair.target, pair.golden, opts or self.opts, self.maps)
        result.pairing = pair.note
        return result


def compare_plan(target_path, golden_path, *, target_run=None, golden_run=None, **options):
    """Pair the two dumps and load the mappings, comparing nothing yet: a ComparePlan. Takes the
    arguments of `compare_dumps`; raises what it raises for bad paths, runs and mappings."""
    opts = CompareOptions(**options)
    maps = _load_mappings(opts)
    pairs = pair_inputs(target_path, golden_path, target_run, golden_run)
    if maps.data and len(pairs) > 1:
        raise MsprobeError("-dm/--data_mapping works on a single rank; give two dump.json files or "
                           "two rank directories")
    _warn_other_hash.cache_clear()  # said once per compare
    return ComparePlan(pairs, opts, maps)


def compare(target_path, golden_path, **kwargs):
    """The comparison as one pandas DataFrame: every pair's table with `step` and `rank` columns first.

    Takes the arguments of `compare_dumps`.

    Example:
        >>> import msprobe
        >>> df = msprobe.compare("bf16/dump.json", "fp32/dump.json")   # doctest: +SKIP
        >>> df[df["Result"] == "error"]                                 # doctest: +SKIP
    """
    import pandas as pd
    frames = []
    for r in compare_dumps(target_path, golden_path, **kwargs):
        t = r.table.copy()
        t.insert(0, "rank", r.rank)
        t.insert(0, "step", r.step)
        frames.append(t)
    return pd.concat(frames, ignore_index=True)

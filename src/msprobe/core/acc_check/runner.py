"""The acc_check run: read the dump, re-run every API not yet done, write rows as they come.

`run_acc_check` runs in this process; `run_multi_acc_check` splits the cases across worker processes
(one per device, or CPU workers), each writing its own part files, and merges them in dump order.
Both resume from an interrupted run's result CSV. Must not import torch or mindspore.
"""

import contextlib
import gc
import importlib
import logging
import multiprocessing
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field

from msprobe.core.acc_check.checker import badness, judge
from msprobe.core.acc_check.csv_files import ResultFiles, merge_parts, read_rows, results_from_csv
from msprobe.core.acc_check.error_data import reproduce_script, save_error_case
from msprobe.core.acc_check.execution import EXECUTOR_MODULES, ExecutorSpec, executor_module
from msprobe.core.acc_check.input_data import TensorSource, rng_for
from msprobe.core.acc_check.input_spec import cases_from_dump
from msprobe.core.acc_check.work_split import work_order
from msprobe.core.dump.api_sources import api_sources_path
from msprobe.core.dump.reader import DumpReader
from msprobe.core.errors import MsprobeError

logger = logging.getLogger(__name__)

PARTS_DIR = "accuracy_checking_parts_{}"
PROGRESS_POLL_S = 0.1  # how often the parent of workers moves the progress bar


@dataclass
class RunReport:
    """What a run did: file paths, per-API results of this run, timing."""

    result_csv: str
    details_csv: str
    framework: str
    device: str
    results: list = field(default_factory=list)  # ApiResult of APIs checked in this invocation
    resumed: int = 0  # APIs found done in the resumed files
    seconds: float = 0.0  # wall time of the whole call: reading the dump, the framework's import, the checks
    check_seconds: float = 0.0  # wall time of the checking itself (what APIs/s is measured over)
    workers: int = 1
    error_data_dir: str = ""
    worker_cpu_s: list = field(default_factory=list)  # CPU seconds of each worker process (multi only)


def _check_options(devices, max_elements):
    """The device ids and the element limit a caller gave, before anything is read."""
    if any(d < 0 for d in devices):
        raise MsprobeError(f"-d {min(devices)}: device ids are integers >= 0")
    if max_elements is not None and max_elements < 1:
        raise MsprobeError(f"--max-elements {max_elements}: expected a number of tensor elements >= 1")


def load_dump(api_info):
    """(reader, cases) of a dump.json; refuses what acc_check cannot use."""
    if os.path.isdir(api_info):
        raise MsprobeError(f"-api_info '{api_info}': is a directory; expected the dump.json of one rank "
                           "(step{N}/rank{R}/dump.json)")
    reader = DumpReader(api_info)
    if reader.framework not in ("pytorch", "mindspore", "mindtorch"):
        raise MsprobeError(f"-api_info '{api_info}': framework {reader.framework!r}; expected a dump with "
                           "\"framework\": \"pytorch\" or \"mindspore\"")
    cases = cases_from_dump(reader.data)
    if not cases:
        raise MsprobeError(f"-api_info '{api_info}': no API forward records (level L1 or mix is needed; "
                           f"found {len(reader)} records)")
    return reader, cases


def timestamp():
    return time.strftime("%Y%m%d%H%M%S")


def executor_options(reader, device, custom_apis, threads, max_elements=None):
    """ExecutorSpec options: the device, `--custom_api` entries, threads, the dump's api_sources.json and
    the limit on a case's tensor elements."""
    return (("device", device), ("custom_apis", tuple(custom_apis)), ("threads", threads),
            ("api_sources", api_sources_path(reader.rank_dir)), ("max_elements", max_elements))


def check_cases(cases, reader, spec, files, save_error_data=False, error_root="", progress=None, seed=1234,
                executor=None):
    """Run `cases` with one executor, appending each result to `files`; yields each ApiResult in order.

    Each API is run, then judged and written, in this thread: judging in a second thread loses to
    GIL hand-offs and both threads sharing the allocator and caches (benchmarks/RESULTS.md, design notes).
    BLAS runs on one thread meanwhile: OpenBLAS's extra threads spin between the metrics' small dot
    products and take a core a second worker process would run on.
    """
    with one_blas_thread():
        yield from _check_cases(cases, reader, spec, files, save_error_data, error_root, progress, seed, executor)


def one_blas_thread():
    """A context with BLAS on one thread (see check_cases); nothing to do where it already is: after a
    fork, setting OpenBLAS's thread count, even to the count it has, restarts its pool with a spinning
    thread."""
    from threadpoolctl import ThreadpoolController
    blas = ThreadpoolController().select(user_api="blas")
    if all(lib.num_threads == 1 for lib in blas.lib_controllers):
        return contextlib.nullcontext()
    return blas.limit(limits=1)


def _check_cases(cases, reader, spec, files, save_error_data, error_root, progress, seed, executor):
    own = executor is None
    executor = executor or spec.create()
    source = TensorSource(reader, real_data=True)
    try:
        for case in cases:
            run = executor.run(case, source, rng_for(case.name, seed))
            result = judge(case, run)
            files.write(result)
            if save_error_data and result.failed:
                save_error_case(error_root, case, run, spec.framework, reproduce_script(spec, case, seed),
                                dict(spec.options).get("api_sources"))
            if progress is not None:
                progress(case.name)
            yield result
    finally:
        if own:  # one it made gives its process back what it changed (run_acc_check closes its own)
            executor.close()


def _progress_bar(total, initial, enabled):
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, unit="API", disable=not enabled, dynamic_ncols=True,
                desc="acc_check")


def run_acc_check(api_info, out_path="./", resume_csv=None, save_error_data=False, device=None,
                  custom_apis=(), progress=True, seed=1234, threads=1, max_elements=None):
    """Check every API of a dump in this process.

    Args:
        api_info: the dump.json of one rank (L1 or mix; statistics = random inputs, tensor = real inputs).
        out_path: where the CSV files (and error_data/) go. Defaults to the current directory.
        resume_csv: the result CSV of an interrupted run: append to it, skipping APIs it has.
        save_error_data: save inputs, outputs and a reproduce script of every failing API.
        device: device index under test; None = the default accelerator, or the CPU without one.
        custom_apis: ("Prefix=python.module", ...) where to find APIs registered with register_custom_api.
        progress: show a progress bar.
        seed: seed of the random inputs.
        threads: the framework's intra-op threads. Defaults to 1: most APIs of a dump are small, where
            a second thread mostly spins.
        max_elements: an API whose recorded tensors hold more elements in all is a SKIP row saying so;
            None = execution.DEFAULT_MAX_ELEMENTS.

    Returns:
        RunReport.
    """
    start = time.perf_counter()
    _check_options([] if device is None else [device], max_elements)
    reader, cases = load_dump(api_info)
    spec = ExecutorSpec(reader.framework, executor_options(reader, device, custom_apis, threads, max_elements))
    out_path = os.path.abspath(out_path)
    with ResultFiles(out_path, timestamp(), resume_csv) as files:
        todo = [c for c in cases if c.name not in files.done]
        executor = spec.create()
        checking = time.perf_counter()
        report = RunReport(files.result_path, files.details_path, reader.framework, executor.device_name,
                           resumed=len(cases) - len(todo))
        error_root = os.path.join(os.path.dirname(files.result_path), "error_data")
        report.error_data_dir = error_root if save_error_data else ""
        bar = _progress_bar(len(cases), report.resumed, progress)
        try:
            for result in check_cases(todo, reader, spec, files, save_error_data, error_root,
                                      progress=lambda _: bar.update(1), seed=seed, executor=executor):
                report.results.append(result)
        finally:
            bar.close()
            executor.close()
    report.check_seconds = time.perf_counter() - checking
    report.seconds = time.perf_counter() - start
    return report


def _worker(index, api_info, names, inherited, next_case, spec_options, framework, part_dir, save_error_data,
            error_root, seed, queue, done):
    """Body of one worker process: check cases of `names` (work_split order), taking the next untaken one
    from the shared counter `next_case` each time, and count each finished API in `done[index]` (shared
    memory the parent polls: no message, pickling or wake-up per API); the one message on `queue` says
    how the worker ended, with its CPU seconds.

    `inherited` is the parent's (reader, cases in `names` order) in a forked worker, which then need
    not read the dump again; None in a spawned one.
    """
    _exit_with_parent()
    try:
        if inherited is None:
            reader, cases = load_dump(api_info)
            by_name = {c.name: c for c in cases}
            cases = [by_name[n] for n in names]
        else:
            reader, cases = inherited
        _check_share(index, reader, cases, ExecutorSpec(framework, spec_options), part_dir, save_error_data,
                     error_root, seed, next_case, lambda _name: _count(done, index))
        queue.put(("exit", index, repr(time.process_time())))
    except BaseException as e:  # the parent reports it; a worker must never hang the run
        queue.put(("failed", index, f"{type(e).__name__}: {e}"))
        raise


def _check_share(index, reader, cases, spec, part_dir, save_error_data, error_root, seed, next_case, progress):
    """One worker's share (the forked ones' and this process's): the cases it takes from `next_case`,
    written to its own part files."""
    with ResultFiles(part_dir, f"w{index}") as files:
        for _ in check_cases(_take(cases, next_case), reader, spec, files, save_error_data, error_root,
                             progress=progress, seed=seed):
            pass


def _count(done, index):
    done[index] += 1  # only this worker writes its slot


def _take(cases, next_case):
    """The cases this worker gets: each one the next that no worker has taken yet."""
    while True:
        with next_case.get_lock():
            i = next_case.value
            next_case.value = i + 1
        if i >= len(cases):
            return
        yield cases[i]


def _exit_with_parent():
    """A worker whose parent was killed (SIGKILL leaves no chance to stop it) ends too, so that a
    resumed run never races an orphan writing the same parts."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(3)
    threading.Thread(target=watch, name="acc_check-parent-watch", daemon=True).start()


def default_start_method(framework, accelerator_count):
    """How run_multi_acc_check starts its workers when not told."""
    # fork is safe before any framework op has run here and saves each worker a torch import; MindSpore
    # starts threads at import, and CUDA/NPU contexts must not be forked
    fork = framework == "pytorch" and not accelerator_count and sys.platform.startswith("linux")
    return "fork" if fork else "spawn"


def run_multi_acc_check(api_info, devices=(0,), out_path="./", resume_csv=None, save_error_data=False,
                        custom_apis=(), progress=True, seed=1234, accelerator_count=None, start_method=None,
                        max_elements=None):
    """Check every API of a dump with one worker process per entry of `devices`.

    On a machine with accelerators each worker uses its device; on a CPU machine the entries just
    count CPU workers, which share the cores (one torch thread each). Worker 0 is this process, which
    takes its share once the others are started: one process fewer to start, and a share that begins
    at once on memory this process has already touched (a forked worker pays for its first writes to
    inherited pages); `-d 0` alone runs no other process.
    Workers take the cases (dump order, the last tenth biggest first: work_split.py) from one
    shared queue and write part files under
    `accuracy_checking_parts_{ts}/`; the parts are merged in dump order
    into the result and details CSVs at the end (and on a resumed run, with what was there).

    Args:
        accelerator_count: how many accelerators the dump's framework sees (0 = CPU workers); default:
            asked of the framework, which is imported for it.
        start_method: multiprocessing start method; default: "fork" for a PyTorch dump on a Linux CPU
            machine (no second torch import per worker, which is what makes two workers pay off on a
            small dump), else "spawn". Pass "spawn" when this process has already run framework ops.
        Others as run_acc_check.
    """
    start = time.perf_counter()
    _check_options(list(devices), max_elements)
    reader, cases = load_dump(api_info)
    if accelerator_count is None:
        accelerator_count = executor_module(reader.framework).accelerator_count()
    if start_method is None:
        start_method = default_start_method(reader.framework, accelerator_count)
    devices = list(devices) or [0]
    if len(set(devices)) != len(devices):
        raise MsprobeError(f"-d {' '.join(map(str, devices))}: a device is listed twice")
    if accelerator_count:
        bad = [d for d in devices if not 0 <= d < accelerator_count]
        if bad:
            raise MsprobeError(f"-d {bad[0]}: no such device; this machine has {accelerator_count} "
                               f"(0..{accelerator_count - 1})")
    out_path = os.path.abspath(out_path)
    with ResultFiles(out_path, timestamp(), resume_csv) as files:
        ts = files.timestamp
        result_path, details_path = files.result_path, files.details_path
    parts_root = os.path.join(os.path.dirname(result_path), PARTS_DIR.format(ts))
    done = set(files.done)
    old_parts = _part_files(parts_root)
    for r_path, _ in old_parts:
        done.update(row["API Name"] for row in read_rows(r_path))
    todo = [c for c in cases if c.name not in done]
    n_workers = min(len(devices), len(todo))  # 0 when a resumed run has nothing left
    ordered = work_order(todo)
    queue_order = [c.name for c in ordered]
    attempt = len(os.listdir(parts_root)) if os.path.isdir(parts_root) else 0
    threads = 1  # as in run_acc_check: small APIs gain nothing from more, workers share the cores
    error_root = os.path.join(os.path.dirname(result_path), "error_data")
    ctx = multiprocessing.get_context(start_method)
    if start_method == "fork":  # workers inherit the framework import instead of repeating it
        importlib.import_module(EXECUTOR_MODULES[reader.framework])
    queue = ctx.Queue()
    next_case = ctx.Value("q", 0)
    done = ctx.RawArray("q", max(n_workers, 1))
    inherited = (reader, ordered) if start_method == "fork" else None
    procs = []
    options = [executor_options(reader, devices[i] if accelerator_count else None, custom_apis, threads,
                                max_elements) for i in range(n_workers)]
    part_dirs = [os.path.join(parts_root, f"worker{i}.{attempt}") for i in range(n_workers)]
    # One BLAS thread from before the fork to the end: the workers' check_cases then find it so and
    # leave OpenBLAS's pool alone (one_blas_thread).
    restore_blas = contextlib.ExitStack()
    restore_blas.enter_context(one_blas_thread())
    # Forked workers share the parent's pages until they write to them, and a collection writes to every
    # tracked object: frozen objects are never collected, so their pages stay shared.
    gc.freeze()
    try:
        for i in range(1, n_workers):  # worker 0 is this process
            p = ctx.Process(target=_worker, name=f"acc_check-worker{i}",
                            args=(i, api_info, queue_order, inherited, next_case, options[i], reader.framework,
                                  part_dirs[i], save_error_data, error_root, seed, queue, done))
            p.start()
            procs.append(p)
    except BaseException:
        restore_blas.close()
        raise
    finally:
        gc.unfreeze()
    bar = _progress_bar(len(cases), len(cases) - len(todo), progress)
    failures = []
    cpu = [0.0] * n_workers
    running = len(procs)
    shown = 0

    def own_progress(_name):
        nonlocal shown
        done[0] += 1
        finished = sum(done)
        bar.update(finished - shown)
        shown = finished
    try:
        if n_workers:
            c0 = time.process_time()
            try:
                _check_share(0, reader, ordered, ExecutorSpec(reader.framework, options[0]), part_dirs[0],
                             save_error_data, error_root, seed, next_case, own_progress)
            except Exception as e:  # the other workers still finish their cases; reported below
                failures.append(f"worker 0: {type(e).__name__}: {e}")
            except BaseException:  # interrupted: the others must not go on alone
                for p in procs:
                    p.terminate()
                raise
            cpu[0] = time.process_time() - c0
        while running:
            try:
                kind, index, text = queue.get(timeout=PROGRESS_POLL_S)
            except Exception:  # queue.Empty: check that nobody died without a word
                if all(not p.is_alive() for p in procs) and queue.empty():
                    break
            else:
                running -= 1
                if kind == "failed":
                    failures.append(f"worker {index}: {text}")
                else:
                    cpu[index] = float(text)
            finished = sum(done)
            bar.update(finished - shown)
            shown = finished
        # each worker closed its part files before its last message: merge and read back while the
        # processes exit (tearing down a worker's memory takes a while)
        merge_parts(_part_files(parts_root), result_path, details_path, [c.name for c in cases])
        if not failures:
            shutil.rmtree(parts_root, ignore_errors=True)
            results = results_from_csv(result_path, details_path, {c.name for c in todo}, badness)
    finally:
        bar.close()
        for p in procs:
            p.join()
        restore_blas.close()
    if failures:
        raise MsprobeError(f"multi_acc_check: {'; '.join(failures)}; finished APIs are in {result_path}, "
                           f"resume with -csv_path {result_path}")
    report = RunReport(result_path, details_path, reader.framework,
                       f"{n_workers} workers" + (f" on devices {devices}" if accelerator_count else " (CPU)"),
                       resumed=len(cases) - len(todo), workers=n_workers, worker_cpu_s=cpu, results=results)
    report.error_data_dir = error_root if save_error_data else ""
    report.seconds = report.check_seconds = time.perf_counter() - start
    return report


def _part_files(parts_root):
    if not os.path.isdir(parts_root):
        return []
    found = []
    for d in sorted(os.listdir(parts_root)):
        r = os.path.join(parts_root, d, "accuracy_checking_result_w" + d.split(".")[0][len("worker"):] + ".csv")
        dd = r.replace("accuracy_checking_result_", "accuracy_checking_details_")
        if os.path.isfile(r) and os.path.isfile(dd):
            found.append((r, dd))
    return found

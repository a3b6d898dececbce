"""DumpWriter: one rank directory of one step — dump.json (or debug.json), stack.json,
construct.json, dump_tensor_data/, dump_error_info.log.

Records arrive from the capture hot path as plain dicts. dump.json is appended record by record and
is valid JSON after every append (crash safety, see json_append.py). Work an adapter hands to the small
thread pool (`submit`: tensor files of device tensors, copied to the host first) may finish later; a
record waiting for it is held back so that dump.json keeps capture order. (The PyTorch adapter writes
files of CPU tensors and computes checksums on the calling thread, from the tensor's own memory.)
Must not import torch or mindspore.
"""

import json
import logging
import os
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import orjson

from msprobe.core.dump.json_append import JsonAppendFile, pwrite_all
from msprobe.core.errors import MsprobeError
from msprobe.core.safe_files import DIR_MODE, FILE_MODE, make_dir, make_dirs, open_new, open_text
from msprobe.core.stack import stack_texts

try:  # the step's directory and files in one call without the GIL (optional, see setup.py)
    from msprobe import _step_files
except ImportError:
    _step_files = None

logger = logging.getLogger(__name__)

TENSOR_DIR = "dump_tensor_data"
# Bytes of tensor data queued for the background writers before the training thread waits.
MAX_INFLIGHT_BYTES = 512 << 20


def run_on(executor, fn):
    """`executor.submit(fn)`, or `fn` run here when the executor takes no more work (at interpreter exit
    the pools stop before atexit functions run: the step a crashed script leaves open is flushed then)."""
    try:
        return executor.submit(fn)
    except RuntimeError:
        done = Future()
        try:
            done.set_result(fn())
        except Exception as e:  # noqa: BLE001 - handed to whoever waits, as the pool would
            done.set_exception(e)
        return done


def rank_dir_name(rank, pid=None):
    return f"rank{rank}" if rank is not None else f"proc{pid if pid is not None else os.getpid()}"


def step_rank_dir(dump_path, step, rank):
    return os.path.join(dump_path, f"step{step}", rank_dir_name(rank))


class DumpExistsError(MsprobeError):
    """The rank directory a run is to write already holds another run's dump."""

    def __init__(self, rank_dir):
        super().__init__(f"dump_path: {os.path.abspath(rank_dir)} already holds a dump from another run; msprobe never "
                         "overwrites or mixes runs: give a new dump_path, or remove that directory")


# rank dirs this process made -> id of the config of the run that made them: a run may reopen its own
# step (close() and start() again), never another run's
_claimed = {}


def check_new_rank_dir(rank_dir, owner):
    """Raise DumpExistsError if `rank_dir` exists and was not made by run `owner` (its config)."""
    if os.path.lexists(rank_dir) and _claimed.get(os.path.abspath(rank_dir)) != id(owner):
        raise DumpExistsError(rank_dir)


def _make_rank_dir(rank_dir, owner=None):
    """`step{N}/rank{R}` with two mkdir calls in the usual case (the dump path exists): right after a
    training step each file-system call is slow (cold caches), and os.makedirs adds a stat per level.
    Directories 0750, none through a link; a rank dir that exists and is not `owner`'s (another run,
    maybe running now) raises DumpExistsError. Returns the directories this call made, innermost first."""
    step_dir = os.path.dirname(rank_dir)
    made = []
    for _ in range(3):  # the rank dir itself is always made exclusively: two runs never share it
        try:
            if make_dir(step_dir):
                made.append(step_dir)
            make_dir(rank_dir, exist_ok=False)
            made.insert(0, rank_dir)
            break
        except FileExistsError:
            if owner is not None and _claimed.get(os.path.abspath(rank_dir)) != id(owner):
                raise DumpExistsError(rank_dir) from None
            make_dir(rank_dir)  # ours: check it is still a real directory
            break
        except FileNotFoundError:  # the dump path is missing (or another rank's discard removed step_dir)
            made += [d for d in make_dirs(step_dir) if d not in made]
    else:
        made = make_dirs(rank_dir)
    if owner is not None:
        _claimed[os.path.abspath(rank_dir)] = id(owner)
    return made


class DumpWriter:
    """Writes one `step{N}/rank{R}` directory.

    Args:
        rank_dir: the directory to write (created).
        task, level, framework: the dump.json envelope.
        debug: write debug.json instead of dump.json (level=debug).
        pool: executor for tensor files and checksums, shared across steps.
        with_tensors: create dump_tensor_data/ and name it in dump_data_dir.
        structure: write construct.json and stack.json. msProbe leaves both out at level debug and
            with extra_info false; construct/stack entries are then ignored.
        finite_records: the caller's records hold no NaN/inf float (it wrote them as json_float
            strings already): dump.json then skips the check for them (see json_append.encode).
    """

    def __init__(self, rank_dir, *, task, level, framework, debug=False, pool=None, with_tensors=False,
                 structure=True, finite_records=False, owner=None):
        self.rank_dir = rank_dir
        self.on_error = None  # called with an OSError from the writer threads (a full disk)
        self.failed = False
        self.tensor_dir = os.path.join(rank_dir, TENSOR_DIR)
        self.structure = structure
        self._dump = self._construct = self._stack_fd = None
        self._stack_len = 2
        files = self._files(task, level, framework, debug, with_tensors, finite_records)
        if not self._make_at_once(files, with_tensors, owner):
            self._made_dirs = _make_rank_dir(rank_dir, owner)
            try:
                self._open_files(files, with_tensors)
            except OSError:  # a full disk: nothing half made is left to look like a dump
                self._remove_made()
                raise
        # stack.json entries [keys, lines] by their lines: two calls on one line (told apart by
        # instruction when captured) share an entry, keys in the order they came
        self._stack_entries = {}
        self._stack_of = {}  # captured stack -> its entry, for this writer
        self._stacks_written = True  # True while stack.json on disk holds every stack added ("{}" now)
        self._pending = deque()  # [key, record, outstanding-future-count]
        self._lock = threading.Lock()
        self._pool = pool
        self._owns_pool = pool is None
        self._inflight = 0
        self._inflight_cv = threading.Condition()
        self._errors = None
        self.records = 0

    def _files(self, task, level, framework, debug, with_tensors, finite_records):
        """The step's JSON files: (attribute, name, head, trailer, indent, finite), in the order they are made;
        stack.json (`{}` at first) comes after them."""
        data_dir = os.path.abspath(self.tensor_dir) if with_tensors else None
        head = ("{\n" + f' "task": {json.dumps(task)},\n "level": {json.dumps(level)},\n'
                f' "framework": {json.dumps(framework)},\n "dump_data_dir": {json.dumps(data_dir)},\n'
                ' "data": {')
        files = [("_dump", "debug.json" if debug else "dump.json", head, "\n }\n}\n", "\n  ", finite_records)]
        if self.structure:  # construct.json maps keys to parent keys or null: never a float
            files.append(("_construct", "construct.json", "{", "\n}\n", "\n ", True))
        return files

    def _make_at_once(self, files, with_tensors, owner):
        """`step{N}/rank{R}`, dump_tensor_data/ and the step's files in one call that holds no GIL
        (msprobe._step_files); False when not done: no extension, or anything but the usual case (the dump
        path missing, the rank directory there, a link, a full disk), which the call undid and
        `_make_rank_dir`/`_open_files` then meet and word as always."""
        if _step_files is None:
            return False
        rank_dir = self.rank_dir
        step_dir = os.path.dirname(rank_dir)
        made = [(os.path.join(rank_dir, name), JsonAppendFile.first_bytes(head, trailer))
                for _, name, head, trailer, _, _ in files]
        if self.structure:
            made.append((os.path.join(rank_dir, "stack.json"), b"{}"))
        try:
            made_step, fds = _step_files.make(step_dir, rank_dir, [self.tensor_dir] if with_tensors else [], made,
                                              DIR_MODE, FILE_MODE)
        except OSError:
            return False
        self._made_dirs = [self.tensor_dir] * with_tensors + [rank_dir] + [step_dir] * made_step
        if owner is not None:
            _claimed[os.path.abspath(rank_dir)] = id(owner)
        for (attr, _, head, trailer, indent, finite), (path, _), fd in zip(files, made, fds):
            setattr(self, attr, JsonAppendFile(path, head=head, trailer=trailer, indent=indent, finite=finite, fd=fd))
        if self.structure:
            self._stack_fd = fds[-1]
        return True

    def _open_files(self, files, with_tensors):
        rank_dir = self.rank_dir
        if with_tensors:
            if make_dir(self.tensor_dir):
                self._made_dirs.insert(0, self.tensor_dir)
        for attr, name, head, trailer, indent, finite in files:
            setattr(self, attr, JsonAppendFile(os.path.join(rank_dir, name), head=head, trailer=trailer,
                                               indent=indent, finite=finite))
        # stack.json is opened with the others and rewritten in place at flush (no temporary file and
        # rename: file-system metadata work is the slow part here); its content only grows, so one
        # pwrite from the start leaves a whole file even if the process is killed
        if self.structure:
            self._stack_fd = open_new(os.path.join(rank_dir, "stack.json"))
            pwrite_all(self._stack_fd, b"{}", 0)

    # -- records -------------------------------------------------------------------------------
    def add(self, key, record, waits=()):
        """Queue one record. `waits` are futures that fill parts of `record` in when they finish.
        Called from the training thread only."""
        if not waits:
            with self._lock:
                if not self._pending:  # nothing before it still waits: write it now, in order
                    self._dump.append(key, record)
                    self.records += 1
                    return
        entry = [key, record, len(waits)]
        with self._lock:
            self._pending.append(entry)
        for fut in waits:
            fut.add_done_callback(lambda f, e=entry: self._one_done(e, f))
        if not waits:
            self._drain()

    def add_many(self, items):
        """Queue `(key, record, waits)` items in order; those that wait for nothing, with nothing before
        them waiting, go to dump.json in one write. Called from one thread at a time (the session's)."""
        ready = []
        with self._lock:
            blocked = bool(self._pending)
        for key, record, waits in items:
            if not blocked and not waits:
                ready.append((key, record))
                continue
            if ready:
                self._write_ready(ready)
                ready = []
            blocked = True
            self.add(key, record, waits)
        if ready:
            self._write_ready(ready)

    def _write_ready(self, ready):
        with self._lock:
            self._dump.append_many(ready)
            self.records += len(ready)

    def add_constructs(self, items):
        """construct.json members `(key, parent)` in one write."""
        if self._construct is not None and items:
            self._construct.append_many(items)

    def _one_done(self, entry, fut):
        exc = fut.exception()
        if isinstance(exc, OSError) and self.on_error is not None:
            self.on_error(exc)  # a full disk: the session stops dumping
        elif exc is not None:
            self.log_error(f"{entry[0]}: {exc!r}")
        with self._lock:
            entry[2] -= 1
        try:
            self._drain()
        except OSError as e:  # on a writer thread: the session hears of it
            if self.on_error is None:
                raise
            self.on_error(e)

    def _drain(self):
        with self._lock:
            while self._pending and self._pending[0][2] == 0:
                key, record, _ = self._pending.popleft()
                self._dump.append(key, record)
                self.records += 1

    def add_construct(self, key, parent):
        if self._construct is not None:
            self._construct.append(key, parent)

    def add_stack(self, key, frames):
        """`frames` is a stack from `capture_stack` (or a tuple of (filename, lineno, function)), from
        innermost outward, already filtered."""
        self.add_stacks(((key, frames),))

    def add_stacks(self, items):
        """stack.json entries `(key, frames)` (see add_stack), in order."""
        if not self.structure or not items:
            return
        stack_of = self._stack_of
        last, entry = object(), None
        for key, frames in items:
            if frames is not last:  # (records made at one place share one stack: an optimizer's updates)
                last, entry = frames, stack_of.get(frames)
                if entry is None:
                    lines = stack_texts(frames)
                    entry = self._stack_entries.get(lines)
                    if entry is None:
                        entry = self._stack_entries[lines] = [[], list(lines)]
                    stack_of[frames] = entry
            entry[0].append(key)
        self._stacks_written = False

    # -- tensors and slow work -----------------------------------------------------------------
    def submit(self, fn, nbytes=0):
        """Run `fn` on the writer pool; the caller blocks while too much data is queued."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="msprobe-writer")
        with self._inflight_cv:
            while self._inflight and self._inflight + nbytes > MAX_INFLIGHT_BYTES:
                self._inflight_cv.wait()
            self._inflight += nbytes

        def run():
            try:
                return fn()
            finally:
                with self._inflight_cv:
                    self._inflight -= nbytes
                    self._inflight_cv.notify_all()
        return run_on(self._pool, run)

    def tensor_path(self, file_name):
        return os.path.join(self.tensor_dir, file_name)

    def log_error(self, message):
        """Append to dump_error_info.log (created on the first error only)."""
        logger.warning("dump error: %s", message)
        with self._lock:
            try:
                if self._errors is None:
                    self._errors = open_text(os.path.join(self.rank_dir, "dump_error_info.log"), "a")
                self._errors.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")
                self._errors.flush()
            except OSError:  # a full disk: said above, and the session stops dumping
                pass

    # -- closing -------------------------------------------------------------------------------
    @property
    def stacks_pending(self):
        """Stacks added since stack.json was last written."""
        return not self._stacks_written

    def write_stacks(self):
        """Write stack.json (deduplicated: one entry per distinct stack, listing the keys sharing it);
        nothing to do when no stack came in since the last write (stop() then step())."""
        if not self.structure or self._stacks_written:
            return
        if self.failed:
            return
        out = {str(i): entry for i, entry in enumerate(self._stack_entries.values())}
        text = orjson.dumps(out, option=orjson.OPT_INDENT_2)  # json.dump's Python encoder: ms per step
        try:
            pwrite_all(self._stack_fd, text, 0)
        except OSError:
            os.ftruncate(self._stack_fd, 0)  # never part old, part new: an empty file is not whole
            raise
        if len(text) < self._stack_len:  # cannot happen (entries only grow), but never leave a tail
            os.ftruncate(self._stack_fd, len(text))
        self._stack_len = len(text)
        self._stacks_written = True

    def mark_incomplete(self, reason):
        """A write failed (a full disk): dump.json ends after its last whole batch with `"incomplete":
        reason`, construct.json after its last whole batch; nothing more is written. Best effort: a file
        that cannot be ended so is left without its closing braces (invalid, never looking whole)."""
        self.failed = True
        self._dump.seal(b"\n },\n \"incomplete\": " + orjson.dumps(str(reason)) + b"\n}\n")
        if self._construct is not None:
            self._construct.seal(b"\n}\n")
        with self._lock:
            self._pending.clear()  # records waiting for files that may never be whole

    def flush(self):
        """Wait for queued tensor files and checksums; write stack.json. Safe to call repeatedly."""
        deadline = time.monotonic() + 600
        while True:
            with self._lock:
                if not self._pending:
                    break
            if time.monotonic() > deadline:
                raise MsprobeError(f"dump writer: {len(self._pending)} records still pending after 600 s")
            time.sleep(0.001)
        self.write_stacks()

    def close(self):
        self.flush()
        self._dump.close()
        if self._construct is not None:
            self._construct.close()
        if self._stack_fd is not None:
            os.close(self._stack_fd)
            self._stack_fd = None
        if self._errors is not None:
            self._errors.close()
        if self._owns_pool and self._pool is not None:
            self._pool.shutdown(wait=True)

    def discard(self):
        """Close and remove what this writer made, for a step that recorded nothing (see PendingWriter).
        Directories are removed only if this writer made them and they are empty."""
        self.close()
        self._remove_made()

    def _remove_made(self):
        for f in (self._dump, self._construct):
            if f is not None:
                f.close()
        if self._stack_fd is not None:
            os.close(self._stack_fd)
            self._stack_fd = None
        paths = [os.path.join(self.rank_dir, name) for name in ("dump.json", "debug.json", "construct.json",
                                                                "stack.json")]
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        for d in self._made_dirs:
            try:
                os.rmdir(d)
            except OSError:  # not empty: another rank, or a file someone else put there
                break


class PendingWriter:
    """A step's DumpWriter being opened on the writer pool while the step begins.

    Making `step{N}/rank{R}` and opening its files at a step's first record, with the caches cold from
    the training step's kernels, costs several times what it does in a warm loop; on the pool that
    work overlaps the forward calls, and the session takes the writer at its first write (a take at
    the first record waited for the pool in the step's first call). A step that records nothing leaves
    no directory: its session discards the writer.

    Args:
        pool: the sessions' executor.
        make: zero-argument callable returning the DumpWriter.
    """

    __slots__ = ("_future",)

    def __init__(self, pool, make):
        self._future = run_on(pool, make)

    def take(self):
        """The writer, once it is open; raises what opening it raised."""
        return self._future.result()

    def discard(self):
        try:
            writer = self._future.result()
        except Exception:  # nothing was made (it would have been raised by take())
            return
        writer.discard()


class NoWriter:
    """The writer of a session whose step directory could not be made: takes everything, writes nothing."""

    failed = True
    records = 0
    stacks_pending = False
    rank_dir = tensor_dir = os.devnull

    def __init__(self):
        self.on_error = None

    def tensor_path(self, file_name):
        return os.devnull

    def submit(self, fn, nbytes=0):
        done = Future()
        done.set_result(None)
        return done

    def _nothing(self, *args, **kwargs):
        return None

    add = add_many = add_constructs = add_construct = add_stack = add_stacks = log_error = _nothing
    write_stacks = mark_incomplete = flush = close = discard = _nothing


class SessionWriter:
    """Mixin of both adapters' DumpSession: `self.writer`, the step's DumpWriter, opened on the pool as
    the session begins (PendingWriter), taken at the first write or tensor file (`_writer()`, on any
    thread: the training thread, the flusher's, a signal's), removed again at close if no record came.
    The session has `cfg`, `dump_path`, `step`, `rank` and `pool`, sets `framework`, and writes no
    NaN/inf float in its records (statistics and scalars come as json_float strings)."""

    framework = None
    # construct.json and stack.json: PyTorch leaves both out at level debug and with extra_info false
    structure_files = True

    def _prepare_writer(self, pool, early=True):
        """`early`: open it now, on `pool` (when there is one); else at the first write. A session whose
        step number changes before its first write calls `renumber_writer`."""
        self.writer = None
        self._writer_lock = threading.Lock()  # (the training thread's tensor file and the flusher's write)
        check_new_rank_dir(step_rank_dir(self.dump_path, self.step, self.rank), self.cfg)  # a rerun: said now
        self._pending_writer = PendingWriter(pool, self._open_writer) if pool is not None and early else None

    def renumber_writer(self):
        """The step number changed before anything was written: the writer opened early under the old one
        goes (its directory with it) and the new number's is prepared as that one was."""
        pending, self._pending_writer = self._pending_writer, None
        if pending is not None:
            pending.discard()
        self._prepare_writer(self.pool, early=pending is not None)

    def _open_writer(self):
        cfg = self.cfg
        return DumpWriter(
            step_rank_dir(self.dump_path, self.step, self.rank), task=cfg.task, level=cfg.level,
            framework=self.framework, debug=cfg.level == "debug", pool=self.pool,
            with_tensors=cfg.task in ("tensor", "overflow_check") or bool(cfg.tensor_list),
            structure=self.structure_files, finite_records=True, owner=cfg)

    def _writer(self):
        if self.writer is None:
            failed = None
            with self._writer_lock:
                if self.writer is None:
                    pending, self._pending_writer = self._pending_writer, None
                    try:
                        writer = pending.take() if pending is not None else self._open_writer()
                    except (OSError, MsprobeError) as e:  # a full disk, another run's directory
                        writer, failed = NoWriter(), e
                    writer.on_error = _weak_call(self._fail)  # the writer must not keep its session alive
                    self.writer = writer
            if failed is not None:
                self._fail(failed)
        return self.writer

    def _fail(self, error):
        raise NotImplementedError

    def _close_writer(self):
        if self.writer is not None:
            self.writer.close()
        elif self._pending_writer is not None:  # nothing recorded: no directory for this step
            self._pending_writer.discard()
            self._pending_writer = None


def _weak_call(method):
    """`method` called through a weak reference to its object (gone: nothing is called)."""
    ref = weakref.WeakMethod(method)

    def call(*args):
        bound = ref()
        if bound is not None:
            bound(*args)
    return call

"""CaptureSession: one step of one rank — the capture flow both adapters share.

    adapter hook/wrapper -> filter -> record, whose tensor summaries may still be on the device
      -> queue (capture order) -> resolve: the summaries reach the host in one transfer per batch
      -> sinks: the overflow gate (task overflow_check), dump.json, construct.json, stack.json

An adapter supplies interception, its Summarizer (the framework's kernels: `summarize`; summaries
that wait: `waiting`, `launch` before a mutation, `pending`, `start_resolve`) and backward tracking; it builds records with `CallRecords` and hands them here with
`emit`/`note_structure`. Records are written in batches, each in one write to dump.json and one to
construct.json, at a resolve: at the adapter's batch points, every `FLUSH_RECORDS` records or
`FLUSH_SECONDS` seconds, at stop() and at the step's end; and, while no record comes, by the
background flusher (flusher.py) once the queue has been idle `IDLE_SECONDS`. A record joins the
queue with one list append and no lock (an append is atomic, whichever thread makes it; a resolve,
holding the lock, takes the entries queued so far and leaves any appended meanwhile); whether the queue is due for a resolve is asked every
`CHECK_EVERY` records, or at the next record once the flusher finds it waited `FLUSH_SECONDS`. A process killed by
SIGKILL keeps every finished step and, of the current one, every record captured up to a second
before. With a `lane` (a one-thread executor: CUDA),
the host side of a resolve — waiting for the copy, filling and writing records — runs off the
training thread, in order.
Framework-free.
"""

import threading
import time

from msprobe.core import naming
from msprobe.core.dump import flusher
from msprobe.core.dump.overflow import OverflowGate
from msprobe.core.dump.records import CallRecords
from msprobe.core.dump.writer import SessionWriter, run_on
from msprobe.core.errors import MsprobeError
from msprobe.core.filters import DumpFilter

_NO_RECORD = object()  # a queue entry of structure notes only
_UNLISTED = object()  # a queue entry's parent when the call has no construct.json / stack.json entry
# what writing a dump can meet: a full disk or I/O error, a directory taken by another run
_WRITE_ERRORS = (OSError, MsprobeError)

# a resolve when this many records wait, or this many summaries, or this long since the last one
FLUSH_RECORDS = 2048
FLUSH_SUMMARIES = 4096
FLUSH_SECONDS = 1.0
# the flusher writes a queue no record joined for this long (the training thread is then elsewhere)
IDLE_SECONDS = 0.5
# records between two looks at whether the queue is due for a resolve (its length, its age, the
# summaries waiting in device slots)
CHECK_EVERY = 32


def _reason(error):
    """One line for dump.json's "incomplete" and the warning."""
    if isinstance(error, OSError) and error.strerror:
        where = f" ({error.filename})" if error.filename else ""
        return f"{error.strerror}{where}"
    return str(error)


class CaptureSession(CallRecords, SessionWriter):
    """Recording state for one step of one rank.

    Args:
        cfg: validated DumpConfig.
        step: the step number (names the step{N} directory).
        rank: rank number for rank{R}, or None for proc{pid}.
        pool: the writer threads (tensor files; the step's files are opened there as the session starts,
            but for overflow_check, which writes in few steps: there the first kept record opens them).
        overflow: the run's OverflowBudget (task overflow_check): records pass an OverflowGate.
        dump_path: the directory of the step dirs (default cfg.dump_path).
        lane: one-thread executor for the host side of resolves, or None (inline).

    Class attributes an adapter sets: `framework`, `saturating` (dtype name -> largest finite
    magnitude, for overflow_check), `structure_levels` (levels whose construct.json holds every call).
    """

    saturating = {}
    structure_levels = ("mix", "L0")
    # a call's records are its values' summaries alone (a filter that takes every call, whole; nothing
    # saved; no overflow gate): the adapter may say so for a session, and records with a fixed shape
    # (optimizer_updates.py) are then made without CallCapture's frames
    plain_calls = False

    def __init__(self, cfg, step, rank, pool=None, overflow=None, dump_path=None, lane=None):
        self.cfg = cfg
        self.step = step
        self.rank = rank
        self.pool = pool
        self.dump_path = dump_path or cfg.dump_path
        self.filter = DumpFilter(cfg)
        self.counter = naming.CallCounter()
        self.module_stack = []  # forward keys of the modules/Cells being run, innermost last
        self.recorded_modules = set()  # "Module.{path}.{Class}" / "Cell..." recorded in forward this step
        self.trackers = {}  # backward trackers waiting for gradients, in creation order
        self.with_stack = cfg.extra_info
        self.tensor_count = 0
        self.gate = (OverflowGate(overflow, self.saturating)
                     if cfg.task == "overflow_check" and overflow is not None else None)
        self.summarizer = self._new_summarizer()
        # [key, record (or _NO_RECORD), check, waits, structure notes (or None), parent (or _UNLISTED),
        # stack]: appended without the lock, taken by a resolve holding it
        self._queue = []
        self._last = {}  # key -> its queued entry, for structure noted after the record
        self._puts = 0  # records queued so far (the flusher tells an idle queue by it)
        self._check_at = 0  # _puts at which the queue is next looked at (_check_queue)
        self._due = False  # set by the flusher: the queue waited FLUSH_SECONDS, the next record resolves it
        self._idle_puts, self._idle_since = 0, time.monotonic()  # the flusher's last look
        self._structure_only = cfg.task == "structure"
        self._kept = set()  # overflow_check: keys of the records written (their structure follows)
        self._lane = lane
        self._lane_work = None  # the last resolve handed to the lane
        self.announce = None  # the debugger's "dumping ... to ..." line, said at the first write
        self._resolved_at = time.monotonic()
        # the queue and the lane's order, shared by the training thread and the flusher
        self._lock = threading.Lock()
        self._construct_all = cfg.extra_info and cfg.level in self.structure_levels
        # overflow_check writes in few steps: there the first kept record opens the step's files
        self._prepare_writer(pool, early=cfg.task != "overflow_check")
        flusher.watch(self)

    def _new_summarizer(self):
        raise NotImplementedError

    # -- a write that failed (a full disk, an unwritable or taken directory) ---------------------------
    failed = None  # the error that stopped this session's dump
    on_failure = None  # the debugger's: told once, from whichever thread met the error

    def _fail(self, error):
        """Stop writing: the step's files end after their last whole write, dump.json marked incomplete;
        every later record is dropped. Training goes on."""
        if self.failed is not None:
            return
        self.failed = error
        self._queue, self._last = [], {}
        writer = self.writer
        if writer is not None:
            writer.mark_incomplete(_reason(error))
        if self.on_failure is not None:
            self.on_failure(self, error)

    # -- records in --------------------------------------------------------------------------------
    def emit(self, key, record, waits=(), check=None, notes=None, parent=_UNLISTED, stack=None):
        """Hand over a finished record; overflow_check keeps it only if `check` (default: the record)
        overflows. `parent`, `stack`: the call's construct.json parent and call stack, when it has those
        entries (`structure_notes` makes them when the queue is written); `notes`: other structure
        notes (construct, value) queued with it. The hot path of every record: one append."""
        if self.failed is not None:
            return
        if self._structure_only:
            if parent is not _UNLISTED:
                notes = self.structure_notes(parent, stack) + (notes or [])
            if notes:
                self._note(key, notes)
            return
        entry = [key, record, check, waits, notes, parent, stack]
        self._puts += 1
        if self._puts >= self._check_at or self._due:
            self._check_queue()  # (before the record joins: a full queue is written first)
        self._queue.append(entry)
        self._last[key] = entry

    def structure_notes(self, parent, stack):
        """The construct.json (with its parent) and stack.json entries of a call, as a list (maybe empty);
        `_write` makes the same for a record queued with its parent and stack."""
        notes = []
        if self.cfg.extra_info and (self._construct_all or parent is not None):
            notes.append((True, parent))
        if stack is not None:
            notes.append((False, stack))
        return notes

    def note_structure(self, key, parent, stack):
        """construct.json (with its parent) and stack.json entries of call `key`."""
        notes = self.structure_notes(parent, stack)
        if notes:
            self._note(key, notes)

    def note_backward(self, key, parent):
        """construct.json entry of a backward record (its parent: the enclosing module's backward)."""
        if self._construct_all:
            self._note(key, [(True, parent)])

    def before_mutation(self, tensors=None):
        """Something is about to change `tensors` in place (None: which ones is not known): the summaries
        waiting for a batch go first — launched on the device (PyTorch) or read (MindSpore) — so that
        their records show the values as they were. The one deferral rule of both adapters."""
        if self.summarizer.waiting:
            with self.calls.ops.work():
                self.summarizer.launch(tensors)

    def _note(self, key, notes):
        with self._lock:  # not into an entry the flusher is writing
            entry = self._last.get(key)
            if entry is not None:
                if entry[4] is None:
                    entry[4] = []
                entry[4].extend(notes)  # written with (and, under overflow_check, only with) its record
                return
        if self.failed is None and (self.gate is None or key in self._kept):
            self._puts += 1
            self._check_queue()
            self._queue.append([key, _NO_RECORD, None, (), notes, _UNLISTED, None])

    def _check_queue(self):
        """Resolve the queue when it is full, has waited FLUSH_SECONDS or holds FLUSH_SUMMARIES device
        summaries. Sets the next look: in CHECK_EVERY records at most, at the record that would fill the
        queue at the latest."""
        try:
            with self._lock:
                queue = self._queue
                if queue and (len(queue) >= FLUSH_RECORDS or self._due
                              or time.monotonic() - self._resolved_at >= FLUSH_SECONDS
                              or self.summarizer.pending >= FLUSH_SUMMARIES):
                    self._resolve(self.summarizer.start_resolve())
                self._due = False
                self._check_at = self._puts + max(1, min(CHECK_EVERY, FLUSH_RECORDS - len(self._queue)))
        except _WRITE_ERRORS as e:
            self._fail(e)

    # -- resolve and write ---------------------------------------------------------------------------
    def resolve(self):
        """Bring every pending summary to the host, then write the records queued so far."""
        try:
            with self._lock:
                self._resolve(self.summarizer.start_resolve())
        except _WRITE_ERRORS as e:
            self._fail(e)

    def _resolve(self, readback, stacks=False):
        """Write the queued records once `readback` (None: nothing to read back) is finished; `stacks`:
        stack.json too. Called holding the lock."""
        self._resolved_at = time.monotonic()
        queue = self._queue
        entries = queue[:]  # (one step each under the GIL: a record appended meanwhile stays queued)
        del queue[:len(entries)]
        self._last = {e[0]: e for e in queue}
        if entries and self.writer is None and self.gate is None:
            self._writer()  # the step's files, at its first write: here, never on the lane

        def finish_and_write(previous=self._lane_work):
            if previous is not None:
                previous.result()  # in order
            if readback is not None:
                readback.finish()
            if self.failed is not None:
                return
            try:
                self._write(entries)
                if stacks and self.writer is not None:
                    self.writer.write_stacks()
            except _WRITE_ERRORS as e:
                self._fail(e)
        if self._lane is None:
            finish_and_write()
        else:
            self._lane_work = run_on(self._lane, finish_and_write)

    def idle_readable(self):
        """Whether the flusher thread may finish the pending summaries itself (see write_idle)."""
        return False

    def write_idle(self):
        """The flusher's turn: write what was queued if no record came for IDLE_SECONDS, with stack.json.
        Summaries still pending are read back here only where the adapter says it is safe off the
        training thread (`idle_readable`: MindSpore CPU tensors read without an op); otherwise (a
        device summary launched here would race the step's next kernels) they wait for the training
        thread's next record, stop() or step(). While records come, a queue that waited FLUSH_SECONDS
        is marked due: the next record resolves it."""
        if self.failed is not None:
            return
        now = time.monotonic()
        if self._queue and now - self._resolved_at >= FLUSH_SECONDS:
            self._due = True  # (the next record's; summaries this thread may not read wait for it)
        puts = self._puts
        if puts != self._idle_puts:  # records came since the last look
            self._idle_puts, self._idle_since = puts, now
            return
        if now - self._idle_since < IDLE_SECONDS:
            return
        summarizer = self.summarizer
        pending = summarizer.pending or getattr(summarizer, "waiting", 0)
        if pending and not self.idle_readable():
            return
        if not self._lock.acquire(timeout=1.0):
            return
        try:
            # asked again holding the lock: a record queued since the look above may wait for a summary
            # (written now, its fields would stay null)
            if self._puts != puts:
                return
            if not pending and (summarizer.pending or getattr(summarizer, "waiting", 0)):
                return
            if self._queue or (self.writer is not None and self.writer.stacks_pending):
                self._resolve(summarizer.start_resolve() if pending else None, stacks=True)
        finally:
            self._lock.release()

    def write_now(self, ending=False):
        """A signal's turn, on the main thread: write everything queued, stack.json too, and wait (a few
        seconds at most) for it to be on disk. Nothing when the signal came inside the queue's lock.
        `ending`: the process dies next, so backward records still waiting for gradients are written
        with those that came, as at a step's end."""
        if self.failed is not None:
            return
        main = threading.current_thread() is threading.main_thread()
        if ending and main and not self._lock.locked():
            self.flush()  # the adapter's step-end flush
            return
        if not self._lock.acquire(timeout=1.0):
            return
        try:
            pending = self.summarizer.pending or getattr(self.summarizer, "waiting", 0)
            if not pending:
                self._resolve(None, stacks=True)
        finally:
            self._lock.release()
        if pending and main:
            self.resolve()  # the adapter's: reads its tensors back as its tool work
            with self._lock:
                self._resolve(None, stacks=True)
        work = self._lane_work
        if work is not None:
            work.result(timeout=5.0)

    def wait_written(self):
        """Until everything resolved so far is written (and raise what writing it raised)."""
        with self._lock:
            work, self._lane_work = self._lane_work, None
        if work is not None:
            work.result()

    def _write(self, entries):
        """The records in order (one write to dump.json for those not waiting for a tensor file), then
        their construct.json entries (one write), then stack.json entries (written at flush)."""
        gate = self.gate
        records, constructs, stacks = [], [], []
        w = None
        extra_info, construct_all = self.cfg.extra_info, self._construct_all
        for key, record, check, waits, notes, parent, stack in entries:
            if gate is not None and record is not _NO_RECORD:
                keep, files = gate.decide(key, record, check)
                if not keep:
                    continue
                self._kept.add(key)
                waits = list(waits) + self._write_kept_files(files)
            if w is None:
                w = self._writer()
                if self.announce is not None:
                    self.announce(w.rank_dir)
                    self.announce = None
            if record is not _NO_RECORD:
                records.append((key, record, waits))
            if parent is not _UNLISTED:  # structure_notes, made here
                if extra_info and (construct_all or parent is not None):
                    constructs.append((key, parent))
                if stack is not None:
                    stacks.append((key, stack))
            if notes:
                for construct, value in notes:
                    (constructs if construct else stacks).append((key, value))
        if w is not None:
            w.add_many(records)
            w.add_constructs(constructs)
            w.add_stacks(stacks)

    def _write_kept_files(self, files):
        """overflow_check: write the tensor files of a kept record; returns their futures. `files` are
        (tensor record, value, file stem) as noted with `gate.note_tensor`."""
        w = self._writer()
        waits = []
        for rec, value, stem in files:
            name = stem + ".npy"
            fut = self.save_tensor_file(value, w.tensor_path(name))
            if fut is not None:
                waits.append(fut)
            rec["data_name"] = name
            self.tensor_count += 1
        return waits

    def save_tensor_file(self, value, path):
        """Write `value` (a tensor or host array) as .npy at `path`; a future when it is written later."""
        raise NotImplementedError

    # -- step end --------------------------------------------------------------------------------
    def emit_partial_backward(self):
        """Backward records of calls whose gradients did not all arrive (an unused output)."""
        for tracker in list(self.trackers):
            tracker.emit_partial()
        self.trackers.clear()

    def flush(self):
        """Step end: partial backward records, every summary resolved, records written, tensor files
        waited for, stack.json written."""
        self.emit_partial_backward()
        self.resolve()
        try:
            self.wait_written()
            with self._lock:  # stack.json: not while the flusher writes it
                if self.writer is not None and self.failed is None:
                    self.writer.flush()
        except _WRITE_ERRORS as e:
            self._fail(e)

    def close(self):
        flusher.unwatch(self)
        try:
            self.flush()
        finally:
            try:
                self.wait_written()
                with self._lock:  # not while the flusher writes
                    self._close_writer()
            except _WRITE_ERRORS as e:
                self._fail(e)
            self.summarizer.clear()

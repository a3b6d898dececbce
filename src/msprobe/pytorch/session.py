"""DumpSession: PyTorch's side of one step's capture — calls and hooks into records.

The capture layers (api_mode, modules, patched_api, backward) call into the session; the flow after a
record is made (queue, summaries resolved in batches, overflow gate, writer) is core/dump/capture.py.
Hot path: `record_call`. Guarded by benchmarks/dump_overhead.py and benchmarks/host_cost.py.
"""

import logging
import os
import weakref

import torch
from torch._C import DisableTorchFunction

from msprobe.core import naming
from msprobe.core.dump.call_capture import CallCapture
from msprobe.core.dump.capture import CaptureSession
from msprobe.core.dump.json_append import scalar_record
from msprobe.core.dump.overflow import BFLOAT16_MAX, FLOAT16_MAX
from msprobe.core.dump.records import common_value_record
from msprobe.core.dump.tensor_files import link_file, write_npy
from msprobe.core.stack import capture_stack, default_walk
from msprobe.pytorch import _state
from msprobe.pytorch.capture import backward as graph
from msprobe.pytorch.capture.backward import BackwardTracker, OneNodeHook, args_edges, input_edges
from msprobe.pytorch.tensor_subclasses import plain_tensor
from msprobe.pytorch.tool_work import tool_work
from msprobe.pytorch.summary.summarizer import Summarizer
from msprobe.pytorch.summary.transfer import host_copy, host_view, numpy_of, numpy_view

try:
    from msprobe._call import CallPath as _CallPath
except ImportError:  # built without a C compiler: every call takes CallCapture.call
    _CallPath = None

_SCALARS = (int, float, bool, str)
_PLAIN = (torch.Tensor, torch.nn.Parameter)
logger = logging.getLogger(__name__)


def _needs_backward(edges, out):
    """Whether a call has a backward to record: an input or an output takes part in autograd."""
    if any(edges):
        return True
    if isinstance(out, torch.Tensor):
        return out.requires_grad
    return any(t.requires_grad for t in flat_tensors(out))


def _run_nested(func, args, kwargs):
    """Run a recorded call; calls it makes itself are nested and not recorded (depth)."""
    _state.depth += 1
    try:
        return func(*args, **kwargs)
    finally:
        _state.depth -= 1


class TorchCallOps:
    """PyTorch's operations in CallCapture's per-call flow (see core/dump/call_capture.py); `s` is the
    DumpSession."""

    __slots__ = ()
    work = tool_work
    before_call = None  # nothing to do as a call starts
    amend_outputs = None
    run = staticmethod(_run_nested)

    @staticmethod
    def before_mutation(s, args, kwargs):
        if s.summarizer.deferred:  # (on the host path nothing waits: the in-place call goes on here)
            s.before_mutation(args, kwargs)

    @staticmethod
    def result_of(s, out, args, inplace):
        """`__setitem__` and collectives return None and mutate their first argument; an in-place
        result's cached statistics are stale."""
        result = args[0] if args and not isinstance(out, torch.Tensor) else out
        s.summarizer.forget((result,) if type(result) in _PLAIN else flat_tensors(result))
        return result

    @staticmethod
    def backward_begin(s, key, parent, args, kwargs, save, inplace, module):
        """The graph edges of the inputs before the call (an in-place call moves them: no backward) and,
        for a module, the autograd watermark: nodes made from here on belong to it."""
        if inplace or not torch.is_grad_enabled():
            return None, args
        edges = None if kwargs else args_edges(args)  # flat positional arguments: the common case
        if edges is None:
            edges = input_edges(flat_tensors(args) + flat_tensors(kwargs) if kwargs else flat_tensors(args))
        return (edges, _state.seq_watermark if module else None), args

    @staticmethod
    def backward_end(s, state, key, parent, out, result, save, inplace, module):
        """Hook the backward of the call; `state`: backward_begin's (input_edges of its inputs, read
        before it ran; the watermark a module's walk starts from)."""
        if not torch.is_grad_enabled():
            return out
        edges, floor = state
        save = save and s.gate is None
        if isinstance(out, torch.Tensor):  # one output (most calls): the one-node shortcut first
            if not (module or out.requires_grad):  # no node to hook
                return out
            tracker = BackwardTracker._attach_one_node(s, key, edges, out, save, parent, floor)
            if tracker is False:
                tracker = BackwardTracker._attach_walk(s, key, edges, [out], save, parent, floor)
        else:
            if out is None or not (module or _needs_backward(edges, out)):
                return out
            tracker = BackwardTracker.attach(s, key, edges, flat_tensors(out), save, parent, floor)
        # a OneNodeHook is never partial: nothing for the step's end to emit
        if tracker is not None and type(tracker) is not OneNodeHook:
            s.trackers[tracker] = None
        return out

    @staticmethod
    def param_record(s, p, stem, save, waits):
        # parameters change in place only in the optimizer, which launches what waits (debugger)
        if not save and type(p) in _PLAIN:  # the common case, without tensor_record's frame
            return s.summarizer.record(p, True, s.summarizer.share_forward)
        return s.tensor_record(p, stem, save, waits, defer=True)


CALLS = CallCapture(TorchCallOps())


class DumpSession(CaptureSession):
    """Recording state for one step of one rank (see CaptureSession for the arguments)."""

    atomic_sequences = (torch.Size,)  # an output torch.Size is one value: {type, value}
    quick_types = _PLAIN
    framework = "pytorch"
    saturating = {"torch.float16": FLOAT16_MAX, "torch.bfloat16": BFLOAT16_MAX}
    structure_levels = ("mix", "L0", "L2")

    def __init__(self, cfg, step, rank, pool=None, overflow=None, lane=None):
        # construct.json and stack.json: left out at level debug and with extra_info false
        self.structure_files = cfg.extra_info and cfg.level != "debug"
        super().__init__(cfg, step, rank, pool=pool, overflow=overflow, lane=lane)
        self.in_optimizer = False
        self.current_api = None  # L2: key of the public API running now (parent of its aten ops)
        self.api_level_l2 = cfg.level == "L2"  # an API call only names its aten ops' parent (record_call)
        # forward summaries may wait for a batch launch where every in-place call is seen (the API mode
        # is on: L1, mix); at L0 a module's code may change a recorded tensor unseen. Records made inside
        # a compiled graph turn it off while they are made: Inductor reuses a buffer once the op returns.
        self.summarizer.defer_forward = cfg.level in ("L1", "mix")
        # a call's backward record may come out at its first node's hook, ahead of the weight's transpose
        # (backward.py): at L1, where no module or parameter hook records in between
        self.fold_transposes = cfg.level == "L1"
        self.compiled_calls = None  # capture/compiled.py: records made inside compiled graphs (their state)
        self.calls = CALLS
        # value_record's complete tensor records may be one dict shared by every record of the same
        # unchanged tensor: nothing reads or extends them before they are written. Off under
        # overflow_check (the gate reads and marks records) and while records of a compiled graph are
        # made (compiled_calls.py: it sets requires_grad on them).
        self.summarizer.share_forward = self.gate is None
        # a plain tensor's record when nothing is saved (CallRecords): the summarizer's, straight
        self.quick_record = self.summarizer.record
        # what a OneNodeHook holds (not the session: a graph the user keeps must not keep the session),
        # and whether its backward records are still wanted (false from the step's end)
        self.weak_self = weakref.ref(self)
        self.backward_open = True
        self._launch_queued = False  # a launch is queued for the end of the backward pass under way
        # CallCapture's flow in C where this session's filter takes every call: the API mode's calls
        # (`fast_call`) and the module hooks' begin and end (`call_path`)
        self.call_path = self._call_path()
        self.fast_call = None if self.call_path is None else self.call_path.call
        self.plain_calls = self.call_path is not None  # (the same conditions; both off to compare)

    def _call_path(self):
        """msprobe._call's CallPath for this session's API and module calls, or None: the flow in Python. For
        a filter that takes every call, nothing saved and no overflow gate (MSPROBE_NATIVE_RECORD=0: off,
        to compare; the C path makes the same records, entries and trackers as `self.calls.call`)."""
        flt = self.filter
        if (_CallPath is None or os.environ.get("MSPROBE_NATIVE_RECORD", "1") == "0" or self.api_level_l2
                or self.gate is not None or not flt.passes_everything or flt.saves_all_tensors or flt.tensor_list
                or not (flt.forward and flt.input and flt.output)):
            return None
        walk, keeps, limit = default_walk()
        summarizer = self.summarizer
        # (no reference to the session: it is handed to each call, so the session is freed without the collector)
        return _CallPath(_state, DisableTorchFunction, torch.Tensor, torch.nn.Parameter, self.counter.counts,
                         self.module_stack, flt, summarizer, summarizer.native_record, self.quick_record,
                         self.calls.ops, self.with_stack, walk, keeps, limit, capture_stack, naming.backward_of,
                         flt.backward, naming.FORWARD, naming.BACKWARD,
                         None if graph.NODE_TYPES is None else (torch.is_grad_enabled, *graph.NODE_TYPES))

    def _new_summarizer(self):
        return Summarizer(stats=self.cfg.wants_stats, md5=self.cfg.summary_mode == "md5")

    # -- values -> records -------------------------------------------------------------------------
    def tensor_record(self, t, file_stem, save, waits, defer=None):
        """`defer`: the summary may wait for the next batch launch (default: forward records at L1/mix)."""
        defer = self.summarizer.defer_forward if defer is None else defer
        if type(t) in _PLAIN:
            rec, entry = self.summarizer.summarize(t, defer)
        else:  # a DTensor's local shard (and which shard it is), a collective's result
            whole, (t, shard) = t, plain_tensor(t)
            rec, entry = self.summarizer.summarize(t, defer)
            rec["requires_grad"] = whole.requires_grad
            if shard is not None:
                rec["shape"] = list(whole.shape)
                rec["shard"] = shard
        if not save:
            return rec
        if self.gate is not None:  # overflow_check: a file only if the record is kept
            self.gate.note_tensor(rec, t.detach(), file_stem)
            return rec
        w = self._writer()
        name = file_stem + ".npy"
        path = w.tensor_path(name)
        if entry is None or entry.file_for(t) is None or not link_file(entry.file_for(t), path):
            fut = self.save_tensor_file(t, path)
            if fut is not None:
                waits.append(fut)
            elif entry is not None:
                entry.set_file(t, path)
        rec["data_name"] = name
        self.tensor_count += 1
        return rec

    def gradient_record(self, g, file_stem, save, waits):
        """A gradient from a backward hook: its summary may wait for a batch launch (launched before the
        next backward pass may add into it: _launch_at_backward_end)."""
        if not save and type(g) in _PLAIN:  # the common case, without tensor_record's frame
            return self.summarizer.record(g, True, self.summarizer.share_forward)
        return self.tensor_record(g, file_stem, save, waits, defer=True)

    def before_mutation(self, args=None, kwargs=None):
        """Something is about to change tensors in place (a call with `args`, `kwargs`, when known):
        launch the summaries waiting for them."""
        summarizer = self.summarizer
        if summarizer.deferred:
            touching = None if args is None else flat_tensors(args) + flat_tensors(kwargs)
            if summarizer.slots.touches(touching):  # (most in-place calls: no tool work to enter)
                super().before_mutation(touching)

    def save_tensor_file(self, t, path):
        """A CPU tensor is written now, from its own memory (nothing to keep safe from later in-place
        edits, nothing for step() to wait for); a CUDA tensor is copied to pinned memory without
        waiting, and written on the pool once the copy is done."""
        if self.failed is not None:
            return None
        x = t.detach()
        if x.device.type == "cpu":
            try:
                write_npy(path, numpy_view(host_view(x)))  # .numpy() would pin the storage's size
            except OSError as e:  # a full disk: the dump stops, training goes on
                self._fail(e)
            return None
        w = self._writer()
        if x.device.type == "cuda":
            copy = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            copy.copy_(x, non_blocking=True)
            done = torch.cuda.Event()
            done.record()

            def write():
                done.synchronize()
                write_npy(path, numpy_of(copy))
        else:
            copy = host_copy(x)

            def write():
                write_npy(path, numpy_of(copy))
        return w.submit(write, copy.numel() * copy.element_size())

    def buffer_record(self, v):
        """Record of an output buffer before the call writes it: what it is, without statistics."""
        if isinstance(v, torch.Tensor):
            rec = {"type": "torch.Tensor", "dtype": str(v.dtype), "shape": list(v.shape)}
            rec.update(self.summarizer.blank_fields)
            rec["requires_grad"] = v.requires_grad
            return rec
        if isinstance(v, (list, tuple)):
            return [self.buffer_record(x) for x in v]
        return self.value_record(v, "", False, [])

    def value_record(self, v, file_stem, save, waits):
        """Record of any argument/output value; nested lists/tuples/dicts keep their shape."""
        if isinstance(v, torch.Tensor):
            if not save and type(v) in _PLAIN:  # the common case, without tensor_record's frame
                return self.summarizer.record(v)
            return self.tensor_record(v, file_stem, save, waits)
        if v is None:
            return None
        if isinstance(v, _SCALARS):
            return scalar_record(v)
        if isinstance(v, (list, tuple)):
            if isinstance(v, torch.Size):
                return {"type": "torch.Size", "value": list(v)}
            if not save:
                return [self.value_record(x, None, False, waits) for x in v]
            return [self.value_record(x, f"{file_stem}.{i}", save, waits) for i, x in enumerate(v)]
        if isinstance(v, dict):
            return {str(k): self.value_record(x, f"{file_stem}.{k}" if save else None, save, waits)
                    for k, x in v.items()}
        return other_value_record(v)

    # -- calls -----------------------------------------------------------------------------------
    def parent_key(self):
        if self.module_stack:
            return self.module_stack[-1]
        return "optimizer" if self.in_optimizer else None

    def record_call(self, prefix, name, func, args, kwargs, inplace=False, mutates=False, buffers=()):
        """Run `func(*args, **kwargs)` and record it as API `{prefix}.{name}.{n}` (CallCapture.call).
        Returns its result. `mutates`: the call changes an argument in place (also
        `F.relu(x, inplace=True)`, which is not recorded as an in-place call). `buffers`: positions and
        names of the arguments it only writes."""
        if self.cfg.level == "L2":  # the API only names the parent of the aten ops it issues
            index = self.counter.next(f"{prefix}.{name}")
            outer, self.current_api = self.current_api, naming.api_key(prefix, name, index, naming.FORWARD)
            try:
                return func(*args, **kwargs)
            finally:
                self.current_api = outer
        return self.calls.call(self, prefix, name, func, args, kwargs, inplace, mutates, buffers)

    def record_aten(self, name, func, args, kwargs, inplace):
        """L2: run aten operator `func` and record it as `Aten.{name}.{n}.forward` (name: `mm.default`)."""
        if not self.filter.forward:
            self.counter.next("Aten." + name)
            return func(*args, **kwargs)
        return self.calls.call(self, "Aten", name, func, args, kwargs, inplace, parent=self.current_api,
                               backward=False)

    def emit_params_grad(self, base, grads):
        flt = self.filter
        if not flt.backward or self.gate is not None:
            return
        counted, stem = naming.params_grad_names(base)
        key = f"{stem}{self.counter.next(counted)}"
        # deferred at every level, as the module's gradient records are: what waits is launched as this
        # backward pass ends (_launch_at_backward_end), before clipping or the next pass can change .grad
        defer = True
        if flt.saves_all_tensors or (flt.tensor_list and flt.saves_tensor(key)):
            waits = []
            record = {n: [self.tensor_record(g, f"{key}.{n}", True, waits, defer=defer) if g is not None else None]
                      for n, g in grads.items()}
        else:  # no files: plain tensors straight to the summarizer, without tensor_record's frame
            waits, summarize, record = (), self.summarizer.record, {}
            for n, g in grads.items():
                record[n] = [None if g is None else summarize(g, defer) if type(g) in _PLAIN
                             else self.tensor_record(g, None, False, waits, defer=defer)]
        self.emit(key, record, waits)
        if self.summarizer.deferred and not self._launch_queued:
            self._launch_at_backward_end()

    def _launch_at_backward_end(self):
        """The next backward pass adds into the `.grad` tensors this one's records are of, in place and
        unseen by the API mode (gradient accumulation): what they wait for is launched as this pass ends,
        and read back and written then too — the flusher never reads a device, so a process that dies or
        hangs after its backward pass would otherwise keep none of the step's records."""
        try:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)
        except RuntimeError:  # not in a backward pass (records emitted at the step's end): the flush launches
            return
        self._launch_queued = True

    def _backward_ended(self):
        self._launch_queued = False
        self.resolve()

    def emit_backward(self, tracker):
        """Called by a BackwardTracker when the gradients of a call are complete."""
        self.trackers.pop(tracker, None)
        self.emit_backward_record(tracker.key, tracker.out_recs, tracker.in_recs, tracker.waits, tracker.parent)

    def emit_backward_record(self, key, out_recs, in_recs, waits, parent):
        """The backward record of call `key`: the gradients of its outputs (`input`) and of its inputs
        (`output`)."""
        flt = self.filter
        record = {"input": out_recs if flt.input else [], "output": in_recs if flt.output else []}
        # overflow_check: kept when the gradients it computed (its "output") overflow; its construct.json
        # entry (note_backward's) rides in the record's queue entry
        self.emit(key, record, waits, check=in_recs, notes=[(True, parent)] if self._construct_all else None)
        if self.summarizer.deferred and not self._launch_queued:
            self._launch_at_backward_end()

    def emit_partial_backward(self):
        self.backward_open = False  # OneNodeHooks that have not fired record nothing from here on
        super().emit_partial_backward()

    # -- step end --------------------------------------------------------------------------------
    def flush(self):
        with tool_work():
            super().flush()
        slots = self.summarizer.slots
        changed, freed = slots.changed, slots.freed
        slots.changed = slots.freed = 0
        if changed:
            self._warn(f"{changed} tensor(s) changed in place before their deferred statistics were read: their "
                       "records show the changed values (MSPROBE_DEFER_SUMMARY=0 reads each one as it is recorded)")
        if freed:
            self._warn(f"{freed} tensor(s) had their memory freed or replaced before their deferred statistics were "
                       "read: their statistics are null (MSPROBE_DEFER_SUMMARY=0 reads each one as it is recorded)")

    def _warn(self, message):
        """Said once: dump_error_info.log's writer says it too."""
        if self.writer is not None:
            self.writer.log_error(message)
        else:
            logger.warning("msprobe: %s", message)

    def resolve(self):
        with tool_work():
            super().resolve()


def flat_tensors(v):
    """Tensors in `v` (nested lists/tuples/dicts) in order of appearance."""
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, dict):
        v = v.values()
    elif not isinstance(v, (list, tuple)):
        return []
    out = []
    for x in v:  # flat arguments (the common case) without a call per element
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple, dict)):
            out.extend(flat_tensors(x))
    return out


def other_value_record(v):
    """Record for a non-tensor, non-container argument (dtype, device, slice, process group ...)."""
    if isinstance(v, torch.dtype):
        return {"type": "torch.dtype", "value": str(v)}
    if isinstance(v, torch.device):
        return {"type": "torch.device", "value": str(v)}
    if isinstance(v, torch.memory_format):
        return {"type": "torch.memory_format", "value": str(v)}
    cls = type(v)
    if cls.__name__ in ("ProcessGroup", "ProcessGroupGloo", "ProcessGroupNCCL"):
        return process_group_record(v)
    if cls.__name__ == "ReduceOp" or cls.__name__ == "RedOpType":
        return {"type": "torch.distributed.ReduceOp", "value": str(v).rsplit(".", 1)[-1]}
    return common_value_record(v)


def process_group_record(group):
    import zlib
    import torch.distributed as dist
    try:
        ranks = dist.get_process_group_ranks(group)
    except (RuntimeError, ValueError, AttributeError):
        ranks = []
    return {"type": "torch.ProcessGroup", "group_ranks": ranks,
            "group_id": f"{zlib.crc32(str(ranks).encode()) & 0xFFFFFFFF:08x}"}


def current_rank():
    """The torch.distributed rank when a process group is up, else None (-> proc{pid})."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return None


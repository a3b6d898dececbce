"""DumpSession: everything recorded in one step — turns calls into records and hands them to the writer.

The capture layers (api_mode, modules, patched_api, backward) call into the session; the session
owns naming counters, filters, statistics and the writer. Hot path: `record_call`.
Guarded by benchmarks/dump_overhead.py.
"""

import functools

import torch

from msprobe.core import naming
from msprobe.core.dump.json_append import scalar_record
from msprobe.core.dump.reader import iter_tensor_records
from msprobe.core.dump.records import CallRecords, common_value_record
from msprobe.core.dump.tensor_files import link_file, write_npy
from msprobe.core.dump.writer import SessionWriter
from msprobe.core.filters import DumpFilter
from msprobe.core.stack import capture_stack
from msprobe.pytorch import _state
from msprobe.pytorch.capture.backward import BackwardTracker, input_edges
from msprobe.pytorch.overflow import record_overflows, tensor_overflows
from msprobe.pytorch.tool_work import tool_work
from msprobe.pytorch.statistics import Summarizer, host_copy, host_view, numpy_of, resolve_deferred

_SCALARS = (int, float, bool, str)


def _edges_before(flt, args, kwargs, inplace):
    """Graph edges of a call's inputs before it runs (an in-place call moves them); None if not needed."""
    if flt.backward and not inplace and torch.is_grad_enabled():
        return input_edges(flat_tensors(args) + flat_tensors(kwargs))
    return None


def _run_nested(func, args, kwargs):
    """Run a recorded call; calls it makes itself are nested and not recorded (depth)."""
    _state.depth += 1
    try:
        return func(*args, **kwargs)
    finally:
        _state.depth -= 1


class DumpSession(CallRecords, SessionWriter):
    """Recording state for one step of one rank.

    Args:
        cfg: validated DumpConfig.
        step: the step number (names the step{N} directory).
        rank: rank number for rank{R}, or None for proc{pid}.
        pool: shared writer thread pool.
    """

    atomic_sequences = (torch.Size,)  # an output torch.Size is one value: {type, value}
    framework = "pytorch"

    def __init__(self, cfg, step, rank, pool=None, overflow=None):
        self.cfg = cfg
        self.step = step
        self.rank = rank
        self.pool = pool
        self.dump_path = cfg.dump_path
        self.structure_files = cfg.extra_info and cfg.level != "debug"
        self.filter = DumpFilter(cfg)
        self.counter = naming.CallCounter()
        self.summarizer = Summarizer(stats=cfg.wants_stats, md5=cfg.summary_mode == "md5",
                                     # overflow_check decides on the values at once: never deferred
                                     defer=cfg.async_dump and cfg.task != "overflow_check")
        self.module_stack = []  # forward keys of the modules being run, innermost last
        self.in_optimizer = False
        self.current_api = None  # L2: key of the public API running now (parent of its aten ops)
        # overflow_check writes in few steps: there the first overflow opens the step's files (not
        # every step making and removing a directory)
        self._prepare_writer(pool, early=cfg.task != "overflow_check")
        # backward trackers still waiting for gradients, in creation order (a dict: flush() emits the
        # partial ones, e.g. an LSTM whose unused cell state never gets a gradient, in a stable order)
        self.trackers = {}
        self._deferred = []  # records holding device statistics until flush (async_dump)
        self.recorded_modules = set()  # "Module.{path}.{Class}" recorded in forward this step
        self.with_stack = cfg.extra_info
        self.tensor_count = 0
        # overflow_check: the run's OverflowBudget; only overflowing records are written
        self.overflow = overflow if cfg.task == "overflow_check" else None

    # -- writer ----------------------------------------------------------------------------------
    def emit(self, key, record, waits=()):
        """Hand one finished record to the writer (structure task writes no data records)."""
        w = self._writer()
        if self.cfg.task == "structure":
            return
        if self._deferred is not None and self.cfg.async_dump:
            self._deferred.append((key, record, waits))
            return
        w.add(key, record, waits)

    def note_structure(self, key, parent, stack):
        w = self._writer()
        if self.cfg.extra_info and (self.cfg.level in ("mix", "L0", "L2") or parent is not None):
            w.add_construct(key, parent)
        if stack is not None:
            w.add_stack(key, stack)

    # -- values -> records -------------------------------------------------------------------------
    def tensor_record(self, t, file_stem, save, waits):
        rec, entry = self.summarizer.summarize(t)
        if save:
            w = self._writer()
            name = file_stem + ".npy"
            path = w.tensor_path(name)
            if entry is None or entry.file_for(t) is None or not link_file(entry.file_for(t), path):
                x = t.detach()
                if x.device.type == "cpu":
                    # written now, from the tensor's own memory: no copy to keep safe from later
                    # in-place edits, nothing left for step() to wait for
                    write_npy(path, numpy_of(host_view(x)))
                    if entry is not None:
                        entry.set_file(t, path)
                else:
                    copy = host_copy(x)
                    waits.append(w.submit(lambda: write_npy(path, numpy_of(copy)),
                                          copy.numel() * copy.element_size()))
            rec["data_name"] = name
            self.tensor_count += 1
        return rec

    def value_record(self, v, file_stem, save, waits):
        """Record of any argument/output value; nested lists/tuples/dicts keep their shape."""
        if isinstance(v, torch.Tensor):
            return self.tensor_record(v, file_stem, save, waits)
        if v is None:
            return None
        if isinstance(v, _SCALARS):
            return scalar_record(v)
        if isinstance(v, (list, tuple)):
            if isinstance(v, torch.Size):
                return {"type": "torch.Size", "value": list(v)}
            return [self.value_record(x, f"{file_stem}.{i}", save, waits) for i, x in enumerate(v)]
        if isinstance(v, dict):
            return {str(k): self.value_record(x, f"{file_stem}.{k}", save, waits) for k, x in v.items()}
        return other_value_record(v)

    # -- calls -----------------------------------------------------------------------------------
    def parent_key(self):
        if self.module_stack:
            return self.module_stack[-1]
        return "optimizer" if self.in_optimizer else None

    def record_call(self, prefix, name, func, args, kwargs, inplace=False):
        """Run `func(*args, **kwargs)` and record it as API `{prefix}.{name}.{n}`. Returns its result."""
        index = self.counter.next(f"{prefix}.{name}")
        key = naming.api_key(prefix, name, index, naming.FORWARD)
        if self.cfg.level == "L2":  # the API only names the parent of the aten ops it issues
            outer, self.current_api = self.current_api, key
            try:
                return func(*args, **kwargs)
            finally:
                self.current_api = outer
        flt = self.filter
        if not flt.want_call(key, self.module_stack):
            return func(*args, **kwargs)
        if self.overflow is not None:
            return self._record_call_overflow(prefix, name, index, key, func, args, kwargs, inplace)
        save = flt.saves_tensor(key)
        listed_forward = flt.wants_forward(key, self.module_stack)  # False: only its backward key is listed
        forward = flt.forward and listed_forward
        waits = []
        with tool_work():
            stack = capture_stack() if self.with_stack else None
            if forward and flt.input:
                in_args, in_kwargs = self.args_records(key, args, kwargs, "input", save, waits)
            else:
                in_args, in_kwargs = [], {}
            # graph edges of the inputs before the call: an in-place call moves them
            edges = _edges_before(flt, args, kwargs, inplace)
        out = _run_nested(func, args, kwargs)
        with tool_work():
            result = self._result_of(out, args, inplace)
            if forward:
                record = {"input_args": in_args, "input_kwargs": in_kwargs,
                          "output": self.outputs_record(key, result, save, waits) if flt.output else []}
                self.emit(key, record, waits)
            if listed_forward:
                self.note_structure(key, self.parent_key(), stack)
            if edges is not None and torch.is_grad_enabled():
                self._track_api_backward(prefix, name, index, edges, out, save)
        return out

    def _result_of(self, out, args, inplace):
        """What a call produced: `__setitem__` and collectives return None and mutate their first argument.
        An in-place result's cached statistics are stale."""
        result = args[0] if inplace and args and not isinstance(out, torch.Tensor) else out
        if inplace:
            self.summarizer.forget(flat_tensors(result))
        return result

    def record_aten(self, name, func, args, kwargs, inplace):
        """L2: run aten operator `func` and record it as `Aten.{name}.{n}.forward` (name: `mm.default`)."""
        key = naming.api_key("Aten", name, self.counter.next("Aten." + name), naming.FORWARD)
        flt = self.filter
        if not flt.forward or not flt.want_call(key, self.module_stack):
            return func(*args, **kwargs)
        overflow = self.overflow
        if overflow is not None and overflow.exhausted:
            return func(*args, **kwargs)
        save = flt.saves_tensor(key) or overflow is not None
        waits = []
        # overflow_check: inputs summarised after the call, and only if it overflowed (in place: before)
        eager = flt.input and (overflow is None or inplace)
        with tool_work():
            stack = capture_stack() if self.with_stack else None
            in_args, in_kwargs = (self.args_records(key, args, kwargs, "input", save and not inplace, waits)
                                  if eager else ([], {}))
        out = func(*args, **kwargs)
        with tool_work():
            if inplace:
                self.summarizer.forget(flat_tensors(out))
            if overflow is not None:
                if not (any(tensor_overflows(t) for t in flat_tensors(out)) and overflow.take(key)):
                    return out
                if flt.input and not eager:
                    in_args, in_kwargs = self.args_records(key, args, kwargs, "input", True, waits)
            record = {"input_args": in_args, "input_kwargs": in_kwargs,
                      "output": self.outputs_record(key, out, save, waits) if flt.output else []}
            if overflow is not None:
                self._writer().add(key, record, waits)
            else:
                self.emit(key, record, waits)
            self.note_structure(key, self.current_api, stack)
        return out

    def _record_call_overflow(self, prefix, name, index, key, func, args, kwargs, inplace):
        """overflow_check: run the call, check its outputs, write a record only when they overflowed.

        Inputs are summarised after the call (they are unchanged by it), except for in-place calls,
        whose inputs are summarised before (no tensor files for those: their memory is overwritten).
        """
        flt = self.filter
        with tool_work():
            pre = (self.args_records(key, args, kwargs, "input", False, [])
                   if inplace and flt.forward and flt.input else None)
            edges = _edges_before(flt, args, kwargs, inplace)
        out = _run_nested(func, args, kwargs)
        with tool_work():
            result = self._result_of(out, args, inplace)
            if (flt.forward and not self.overflow.exhausted
                    and any(tensor_overflows(t) for t in flat_tensors(result))
                    and self.overflow.take(key)):
                waits = []
                if not flt.input:
                    in_args, in_kwargs = [], {}
                elif pre is not None:
                    in_args, in_kwargs = pre
                else:
                    in_args, in_kwargs = self.args_records(key, args, kwargs, "input", True, waits)
                record = {"input_args": in_args, "input_kwargs": in_kwargs,
                          "output": self.outputs_record(key, result, True, waits) if flt.output else []}
                self._writer().add(key, record, waits)
                self.note_structure(key, self.parent_key(), capture_stack() if self.with_stack else None)
            if edges is not None and torch.is_grad_enabled() and not self.overflow.exhausted:
                self._track_api_backward(prefix, name, index, edges, out, False)
        return out

    def _overflow_keeps(self, key, record, outputs):
        """overflow_check gate for a finished module or backward record."""
        return record_overflows(outputs) and self.overflow.take(key)

    def begin_module(self, key, args, kwargs):
        """Module pre-hook: statistics of the inputs now, before an in-place forward changes them."""
        flt = self.filter
        save = flt.saves_tensor(key)
        waits = []
        stack = capture_stack() if self.with_stack else None
        lazy = self.overflow is not None  # overflow_check: inputs summarised only if the module overflows
        forward = flt.forward and not lazy and flt.wants_forward(key, self.module_stack)
        in_args, in_kwargs = (self.args_records(key, args, kwargs, "input", save, waits)
                              if forward and flt.input else ([], {}))
        # graph edges of the inputs before forward: an in-place module (ReLU(inplace=True)) moves them
        edges = (input_edges(flat_tensors(args) + flat_tensors(kwargs))
                 if flt.backward and torch.is_grad_enabled() else None)
        # autograd nodes made from here on belong to this module, also those of the calls inside it
        return save, waits, stack, in_args, in_kwargs, edges, _state.seq_watermark

    def end_module(self, key, parent, module, frame, args, kwargs, output):
        save, waits, stack, in_args, in_kwargs, edges, floor = frame
        flt = self.filter
        base = key.rsplit(".", 2)[0]
        self.recorded_modules.add(base)
        if self.overflow is not None:
            self._end_module_overflow(key, parent, module, stack, args, kwargs, output)
        elif flt.forward and flt.wants_forward(key, self.module_stack):  # (its own key is popped already)
            params = {n: self.tensor_record(p, f"{key}.parameters.{n}", save, waits)
                      for n, p in own_parameters(module)}
            record = {"input_args": in_args, "input_kwargs": in_kwargs,
                      "output": self.outputs_record(key, output, save, waits) if flt.output else [],
                      "parameters": params}
            self.emit(key, record, waits)
        if self.overflow is None:
            self.note_structure(key, parent, stack)
        if edges is not None and torch.is_grad_enabled() and output is not None:
            bwd = key.replace(".forward.", ".backward.")
            bwd_parent = parent.replace(".forward.", ".backward.") if parent else None
            self.track_backward(bwd, edges, output, save, parent=bwd_parent, floor=floor)

    def _end_module_overflow(self, key, parent, module, stack, args, kwargs, output):
        flt = self.filter
        if (not flt.forward or self.overflow.exhausted
                or not any(tensor_overflows(t) for t in flat_tensors(output)) or not self.overflow.take(key)):
            return
        waits = []
        in_args, in_kwargs = (self.args_records(key, args, kwargs, "input", True, waits)
                              if flt.input else ([], {}))
        params = {n: self.tensor_record(p, f"{key}.parameters.{n}", True, waits)
                  for n, p in own_parameters(module)}
        record = {"input_args": in_args, "input_kwargs": in_kwargs,
                  "output": self.outputs_record(key, output, True, waits) if flt.output else [],
                  "parameters": params}
        self._writer().add(key, record, waits)
        self.note_structure(key, parent, stack)

    def emit_params_grad(self, base, grads):
        if not self.filter.backward or self.overflow is not None:
            return
        key = naming.params_grad_key(*_split_module_base(base), self.counter.next(base + ".parameters_grad"))
        save = self.filter.saves_tensor(key)
        waits = []
        record = {n: [self.tensor_record(g, f"{key}.{n}", save, waits) if g is not None else None]
                  for n, g in grads.items()}
        self.emit(key, record, waits)

    def _track_api_backward(self, prefix, name, index, edges, out, save):
        """Hook the backward of API call `{prefix}.{name}.{index}`, under the enclosing module's backward."""
        parent = self.module_stack[-1].replace(".forward.", ".backward.") if self.module_stack else None
        self.track_backward(naming.api_key(prefix, name, index, naming.BACKWARD), edges, out, save, parent)

    def track_backward(self, bwd_key, edges, out, save, parent=None, floor=None):
        """Hook the backward of a call; `edges` are `input_edges` of its inputs, read before it ran."""
        outputs = flat_tensors(out)
        tracker = BackwardTracker.attach(self, bwd_key, edges, outputs, save, parent, floor)
        if tracker is not None:
            self.trackers[tracker] = None

    def emit_backward(self, tracker):
        """Called by a BackwardTracker when the gradients of a call are complete."""
        self.trackers.pop(tracker, None)
        flt = self.filter
        record = {"input": tracker.out_recs if flt.input else [],
                  "output": tracker.in_recs if flt.output else []}
        if self.overflow is not None:
            if not self._overflow_keeps(tracker.key, record, tracker.in_recs):
                return
            self._writer().add(tracker.key, record, tracker.waits)
            if self.cfg.extra_info:
                self._writer().add_construct(tracker.key, tracker.parent)
            return
        self.emit(tracker.key, record, tracker.waits)
        if self.cfg.extra_info and self.cfg.level in ("mix", "L0", "L2"):  # extra_info false: no structure
            self._writer().add_construct(tracker.key, tracker.parent)

    # -- step end --------------------------------------------------------------------------------
    def flush(self):
        """Emit partial backward records, resolve deferred statistics, write stack.json."""
        with tool_work():
            for tracker in list(self.trackers):
                tracker.emit_partial()
            self.trackers.clear()
            if self.cfg.async_dump and self._deferred:
                pending, self._deferred = self._deferred, None
                for key, record, waits in pending:
                    for _, rec in iter_tensor_records(record):
                        resolve_deferred(rec)
                    self._writer().add(key, record, waits)
                self._deferred = []
        if self.writer is not None:
            self.writer.flush()

    def close(self):
        self.flush()
        self._close_writer()
        self.summarizer.clear()


@functools.lru_cache(maxsize=None)  # one per module, asked once per step for each
def _split_module_base(base):
    prefix, rest = base.split(".", 1)
    path, cls = rest.rsplit(".", 1)
    return prefix, path, cls


def own_parameters(module):
    """`module.named_parameters(recurse=False)` without its generator machinery (once per recorded
    module call): the module's own registered parameters, unset (None) ones left out."""
    return [(n, p) for n, p in module._parameters.items() if p is not None]


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


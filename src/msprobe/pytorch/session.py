"""DumpSession: PyTorch's side of one step's capture — calls and hooks into records.

The capture layers (api_mode, modules, patched_api, backward) call into the session; the flow after a
record is made (queue, summaries resolved in batches, overflow gate, writer) is core/dump/capture.py.
Hot path: `record_call`. Guarded by benchmarks/dump_overhead.py and benchmarks/host_cost.py.
"""

import functools
import logging

import torch

from msprobe.core import naming
from msprobe.core.dump.capture import CaptureSession
from msprobe.core.dump.json_append import scalar_record
from msprobe.core.dump.overflow import BFLOAT16_MAX, FLOAT16_MAX
from msprobe.core.dump.records import common_value_record
from msprobe.core.dump.tensor_files import link_file, write_npy
from msprobe.core.stack import capture_stack
from msprobe.pytorch import _state
from msprobe.pytorch.capture.backward import BackwardTracker, input_edges
from msprobe.pytorch.tensor_subclasses import plain_tensor
from msprobe.pytorch.tool_work import tool_work
from msprobe.pytorch.summary.summarizer import Summarizer
from msprobe.pytorch.summary.transfer import host_copy, host_view, numpy_of

_SCALARS = (int, float, bool, str)
_PLAIN = (torch.Tensor, torch.nn.Parameter)
logger = logging.getLogger(__name__)


def _edges_before(flt, args, kwargs, inplace):
    """Graph edges of a call's inputs before it runs (an in-place call moves them); None if not needed."""
    if flt.backward and not inplace and torch.is_grad_enabled():
        return input_edges(flat_tensors(args) + flat_tensors(kwargs))
    return None


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


class DumpSession(CaptureSession):
    """Recording state for one step of one rank (see CaptureSession for the arguments)."""

    atomic_sequences = (torch.Size,)  # an output torch.Size is one value: {type, value}
    framework = "pytorch"
    saturating = {"torch.float16": FLOAT16_MAX, "torch.bfloat16": BFLOAT16_MAX}
    structure_levels = ("mix", "L0", "L2")

    def __init__(self, cfg, step, rank, pool=None, overflow=None, lane=None):
        # construct.json and stack.json: left out at level debug and with extra_info false
        self.structure_files = cfg.extra_info and cfg.level != "debug"
        super().__init__(cfg, step, rank, pool=pool, overflow=overflow, lane=lane)
        self.in_optimizer = False
        self.current_api = None  # L2: key of the public API running now (parent of its aten ops)
        self.recorded_modules = set()  # "Module.{path}.{Class}" recorded in forward this step
        # forward summaries may wait for a batch launch where every in-place call is seen (the API mode
        # is on: L1, mix); at L0 a module's code may change a recorded tensor unseen. Records made inside
        # a compiled graph turn it off while they are made: Inductor reuses a buffer once the op returns.
        self.defer_forward = cfg.level in ("L1", "mix")
        self.compiled_calls = None  # capture/compiled.py: records made inside compiled graphs (their state)

    def _new_summarizer(self):
        return Summarizer(stats=self.cfg.wants_stats, md5=self.cfg.summary_mode == "md5")

    # -- values -> records -------------------------------------------------------------------------
    def tensor_record(self, t, file_stem, save, waits, defer=None):
        """`defer`: the summary may wait for the next batch launch (default: forward records at L1/mix)."""
        defer = self.defer_forward if defer is None else defer
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
        """A gradient from a backward hook: its summary may wait for a batch launch (autograd does not
        accumulate in place into a gradient someone else holds)."""
        return self.tensor_record(g, file_stem, save, waits, defer=True)

    def before_mutation(self, args=None, kwargs=None):
        """Something is about to change tensors in place (a call with `args`, `kwargs`, when known):
        launch the summaries waiting for them."""
        if self.summarizer.waiting:
            with tool_work():
                self.summarizer.launch(None if args is None else flat_tensors(args) + flat_tensors(kwargs))

    def save_tensor_file(self, t, path):
        """A CPU tensor is written now, from its own memory (nothing to keep safe from later in-place
        edits, nothing for step() to wait for); a CUDA tensor is copied to pinned memory without
        waiting, and written on the pool once the copy is done."""
        if self.failed is not None:
            return None
        x = t.detach()
        if x.device.type == "cpu":
            try:
                write_npy(path, numpy_of(host_view(x)))
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

    def record_call(self, prefix, name, func, args, kwargs, inplace=False, mutates=False, buffers=()):
        """Run `func(*args, **kwargs)` and record it as API `{prefix}.{name}.{n}`. Returns its result.
        `mutates`: the call changes an argument in place (also `F.relu(x, inplace=True)`, which is not
        recorded as an in-place call). `buffers`: positions and names of the arguments it only writes."""
        index = self.counter.next(f"{prefix}.{name}")
        key = naming.api_key(prefix, name, index, naming.FORWARD)
        if self.cfg.level == "L2":  # the API only names the parent of the aten ops it issues
            outer, self.current_api = self.current_api, key
            try:
                return func(*args, **kwargs)
            finally:
                self.current_api = outer
        flt = self.filter
        gate = self.gate
        if not flt.want_call(key, self.module_stack) or (gate is not None and gate.exhausted):
            return func(*args, **kwargs)
        # overflow_check: every record may be kept, with its files (an in-place call's inputs have none:
        # their memory is overwritten)
        save = flt.saves_tensor(key) or gate is not None
        listed_forward = flt.wants_forward(key, self.module_stack)  # False: only its backward key is listed
        forward = flt.forward and listed_forward
        waits = []
        with tool_work():
            stack = capture_stack() if self.with_stack else None
            if forward and flt.input:
                in_args, in_kwargs = self.args_records(key, args, kwargs, "input",
                                                       save and not (inplace and gate is not None), waits,
                                                       buffers)
            else:
                in_args, in_kwargs = [], {}
            # graph edges of the inputs before the call: an in-place call moves them
            edges = _edges_before(flt, args, kwargs, inplace)
            if inplace or mutates:
                self.before_mutation(args, kwargs)
        out = _run_nested(func, args, kwargs)
        with tool_work():
            result = self._result_of(out, args, inplace)
            if forward:
                outs = self.outputs_record(key, result, save, waits) if flt.output or gate is not None else []
                record = {"input_args": in_args, "input_kwargs": in_kwargs, "output": outs if flt.output else []}
                self.emit(key, record, waits, check=outs)
            if listed_forward:
                self.note_structure(key, self.parent_key(), stack)
            if edges is not None and torch.is_grad_enabled() and _needs_backward(edges, out):
                self._track_api_backward(prefix, name, index, edges, out, save and gate is None)
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
        gate = self.gate
        if gate is not None and gate.exhausted:
            return func(*args, **kwargs)
        save = flt.saves_tensor(key) or gate is not None
        waits = []
        with tool_work():
            stack = capture_stack() if self.with_stack else None
            in_args, in_kwargs = (self.args_records(key, args, kwargs, "input", save and not inplace, waits)
                                  if flt.input else ([], {}))
        out = func(*args, **kwargs)
        with tool_work():
            if inplace:
                self.summarizer.forget(flat_tensors(out))
            outs = self.outputs_record(key, out, save, waits) if flt.output or gate is not None else []
            record = {"input_args": in_args, "input_kwargs": in_kwargs, "output": outs if flt.output else []}
            self.emit(key, record, waits, check=outs)
            self.note_structure(key, self.current_api, stack)
        return out

    def begin_module(self, key, args, kwargs):
        """Module pre-hook: statistics of the inputs now, before an in-place forward changes them."""
        inputs = self.module_inputs(key, args, kwargs, capture_stack() if self.with_stack else None)
        # graph edges of the inputs before forward: an in-place module (ReLU(inplace=True)) moves them
        edges = (input_edges(flat_tensors(args) + flat_tensors(kwargs))
                 if self.filter.backward and torch.is_grad_enabled() else None)
        # autograd nodes made from here on belong to this module, also those of the calls inside it
        return inputs + (edges, _state.seq_watermark)

    def module_inputs(self, key, args, kwargs, stack):
        """The first half of a module's record: (save, waits, stack, input_args, input_kwargs)."""
        flt = self.filter
        save = flt.saves_tensor(key) or self.gate is not None
        waits = []
        forward = (flt.forward and flt.wants_forward(key, self.module_stack)
                   and not (self.gate is not None and self.gate.exhausted))
        in_args, in_kwargs = (self.args_records(key, args, kwargs, "input", save, waits)
                              if forward and flt.input else ([], {}))
        return save, waits, stack, in_args, in_kwargs

    def end_module(self, key, parent, module, frame, args, kwargs, output):
        save, edges, floor = frame[0], frame[5], frame[6]
        self.emit_module(key, parent, frame[:5], own_parameters(module), output)
        if edges is not None and torch.is_grad_enabled() and output is not None:
            self.track_backward(naming.backward_of(key), edges, output, save and self.gate is None,
                                parent=naming.backward_of(parent) if parent else None, floor=floor)

    def emit_module(self, key, parent, inputs, params, output):
        """A module's record from `module_inputs`' half, its own (name, parameter) pairs and its output;
        returns the output records (None when not recorded)."""
        save, waits, stack, in_args, in_kwargs = inputs
        flt = self.filter
        self.recorded_modules.add(key.rsplit(".", 2)[0])
        gate = self.gate
        if (flt.forward and flt.wants_forward(key, self.module_stack)  # (its own key is popped already)
                and not (gate is not None and gate.exhausted)):
            # parameters change in place only in the optimizer, which launches what waits (debugger)
            params = {n: self.tensor_record(p, f"{key}.parameters.{n}", save, waits, defer=True) for n, p in params}
            outs = self.outputs_record(key, output, save, waits) if flt.output or gate is not None else []
            record = {"input_args": in_args, "input_kwargs": in_kwargs, "output": outs if flt.output else [],
                      "parameters": params}
            self.emit(key, record, waits, check=outs)
        else:
            outs = None
        self.note_structure(key, parent, stack)
        return outs

    def emit_params_grad(self, base, grads):
        if not self.filter.backward or self.gate is not None:
            return
        key = naming.params_grad_key(*_split_module_base(base), self.counter.next(base + ".parameters_grad"))
        save = self.filter.saves_tensor(key)
        waits = []
        # .grad may change in place (clipping): where the API mode sees that (L1, mix) the summaries wait
        # for a batch; at L0 the module's gradients go in one batch launched before this hook returns
        record = {n: [self.tensor_record(g, f"{key}.{n}", save, waits, defer=True) if g is not None else None]
                  for n, g in grads.items()}
        if not self.defer_forward:
            self.summarizer.launch([g for g in grads.values() if g is not None])
        self.emit(key, record, waits)

    def _track_api_backward(self, prefix, name, index, edges, out, save):
        """Hook the backward of API call `{prefix}.{name}.{index}`, under the enclosing module's backward."""
        parent = naming.backward_of(self.module_stack[-1]) if self.module_stack else None
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
        # overflow_check: kept when the gradients it computed (its "output") overflow
        self.emit(tracker.key, record, tracker.waits, check=tracker.in_recs)
        self.note_backward(tracker.key, tracker.parent)

    # -- step end --------------------------------------------------------------------------------
    def flush(self):
        with tool_work():
            super().flush()
        changed = self.summarizer.slots.changed
        if changed:
            self.summarizer.slots.changed = 0
            message = (f"{changed} tensor(s) changed in place before their deferred statistics were read: their "
                       "records show the changed values (MSPROBE_DEFER_SUMMARY=0 reads each one as it is recorded)")
            logger.warning("msprobe: %s", message)
            if self.writer is not None:
                self.writer.log_error(message)

    def resolve(self):
        with tool_work():
            super().resolve()


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


"""Host microseconds msprobe spends per record and per tensor summary, on a model whose kernels take
microseconds (a deep, narrow MLP on the CPU): what a dump costs wherever the device is fast.

Each round times every config in turn, each in a slot of its own (a fresh debugger, closed after it),
where timed steps with the debugger follow steps without it (one process, one run); µs per record =
(median over rounds of: median dumped step - median plain step) / records written per step. `*_device` configs
take the accelerator path (MSPROBE_DEVICE_SUMMARY=1: summaries into device slots, read back in batches).
The per-summary line times `Summarizer.summarize` alone on fresh (uncached) small tensors.
`L0_floor` and `L1_floor` are the least any hook-based dump of that level does on this model: the hooks
alone (module hooks installed once and idle between steps, as msprobe's are, or a TorchFunctionMode that
passes each API on), each reading its tensors once with msprobe's statistics kernel, and nothing else (no
names, records or files); their µs per record
divide by the records msprobe writes at that level, and msprobe's rows say how far above that they are.
`L0_bare` and `L1_bare` are the same hooks reading nothing; a line says how many times that msprobe's
rows of the level cost (target: 3x). Issue 32's "bare interception floor" is L1_bare's mode (it passes
each call on and hooks its output's autograd node) whatever the level, over that level's records: a second
line gives it, with a device config's host part against it. At L0 the first line is the stricter (the
module hooks alone cost less than the mode).
`L0_records` and `L1_records` are the records floors: msprobe's records of the level themselves (at L0 the
same dump.json and construct.json, at L1 the same records but for the order of a backward record's input
gradients: tests/benchmarks), made and written the plainest way in Python on the floors' hooks and reads
(RecordFloor, ApiRecordFloor); a line gives msprobe's rows of the level over them: what msprobe costs beyond
making its records at all, where the floors above bound the hooks and reads alone.
`L0_device_records` and `L1_device_records` are the device records floors: the same records with their reads
queued and reduced in batches, as the device path must (an L0 forward value copied at its hook, a launch each;
the rest held and read before an in-place call or the optimizer changes them, and at step()), read back once
(DeviceRecordFloor: msprobe's device path's dump at L0; at L1 its records as the records floor's); a line gives
their host part, msprobe's device configs' host part over it, and msprobe's CPU path over it: below 1, the
CPU path costs less than the plainest device-path dump of the same records.
A second table splits each config's extra time by phase of the step (PHASES), against the same phase of
its level's floor: where the cost is.
`--device cuda` trains the model on the GPU, where its kernels take microseconds and every config takes
the accelerator path: the host cost of a dump on the device it is made for (each step ends in a sync).

Host part of the device path. On the CPU a `*_device` config's cost includes what the summary kernels
compute, which on an accelerator is device time, not host time. So after each round's timed steps one
more dumped step runs under torch.profiler (untimed), with a profiler range around each place the device
path runs kernels (the torch kernels' batches, a staging copy, the readback's copy: KERNEL_SITES); the
self time of the aten ops inside those ranges — all but the views and allocations (NO_KERNEL), which
launch nothing on a device — is the step's kernel time, its median over rounds subtracted from the extra
time: `host us/rec` = (extra - kernel) / records, and `kernels/rec` counts those ops. The subtraction
takes out each op's dispatch with its compute; on CUDA a launch costs the host a few µs: add kernels/rec
times that to compare. Checked with `--check` on a case whose answer is known: the L0 hooks alone
(`hooks`) against the same hooks plus one 64K-element reduction per hooked tensor inside a kernel range
(`hooks+kernels`): the latter's host µs per record must come back to the former's extra (plus the
Python of calling the op), whatever the reduction costs.

    python benchmarks/host_cost.py                # 15 rounds (--record: into RESULTS.md)
    python benchmarks/host_cost.py --quick        # CI smoke
    python benchmarks/host_cost.py --baseline-src OLD/src --configs L1,mix   # A/B against another checkout
    python benchmarks/host_cost.py --check        # the kernel subtraction against a known answer
    python benchmarks/host_cost.py --seq 4 --configs L1,L1_floor   # a transformer's [batch, sequence, features] input

With --toggle the measurement is an in-process A/B of one switch msprobe reads as a dump starts (a module
attribute, or an environment variable): each round gives each config one debugger, and its timed dumped
steps take the switch's values in turn, each followed by a plain step; the table gives each value's extra
ms a step (median over rounds) and their ratio. Both sides share the process, its caches and the machine's
load of the same second, so it resolves a change of a few percent where alternating processes do not.

    python benchmarks/host_cost.py --toggle msprobe.pytorch.summary.cache.UNKEYED_MAX=0,8192 --configs L0,L1
    python benchmarks/host_cost.py --toggle env:MSPROBE_NATIVE_RECORD=0,1 --configs L1

With --record-calls the timed rounds are not run: in each of --rounds rounds each msprobe config in turn dumps
--steps steps (after two untimed ones) with a clock around every call of msprobe._record's `record` (the one
per-tensor entry of both paths), counted by the phase of the step it runs in (PHASES), and around the
device path's batch reads (DeviceSummaries.launch). It says what a record costs inside a real step, where
the GIL each torch op releases lets other threads' work (the previous step's writes) in: a loop of records
alone shows less. The clock's own call is in the numbers (about 0.2 µs a call). With `--device cuda` the batch
reads are the host's time to queue them (the kernels run after).

    python benchmarks/host_cost.py --record-calls --configs L0,L0_device,L1,L1_device

With --baseline-src the measurement runs in child processes, this checkout's and the other's msprobe in
turn (`--alternations` pairs), and the table gives the median of each side and their ratio: a shared
machine's load drifts by more than a change to the hot path is worth, so both sides must see the same drift.
"""

import argparse
import ast
import concurrent.futures
import contextlib
import functools
import gc
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import orjson
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.profiler import ProfilerActivity, profile, record_function

import msprobe
from msprobe.core.dump.reader import find_rank_dirs, iter_tensor_records
from msprobe.pytorch import PrecisionDebugger
from msprobe.pytorch.capture.api_table import build_api_table
from msprobe.core.dump import moments
from msprobe.core.gc_pause import CollectorPause
try:
    from msprobe.pytorch.summary.host import PARALLEL_MIN as _PARALLEL_MIN  # msprobe's split: the same threads here
    from msprobe.pytorch.summary.layout import memory_order
    from msprobe.pytorch.summary.summarizer import Summarizer
except ImportError:  # --baseline-src: a checkout from before pytorch/summary/
    from msprobe.pytorch.statistics import _PARALLEL_MIN, Summarizer, memory_order

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (beside this script: timed steps)

TARGET_US_PER_RECORD = 15.0
# config -> (level, summary_mode, device path)
CONFIGS = {
    "L0": ("L0", "statistics", False),
    "L1": ("L1", "statistics", False),
    "mix": ("mix", "statistics", False),
    "md5_L1": ("L1", "md5", False),
    "L0_device": ("L0", "statistics", True),
    "L1_device": ("L1", "statistics", True),
    "mix_device": ("mix", "statistics", True),
    "md5_device": ("L1", "md5", True),
}
# from this many elements a floor reads a tensor it has read this step (an activation passed on) only once
ONCE_MIN = 8192
# the floor of a level: its hooks, each tensor read once (no debugger); level -> the config it bounds
FLOORS = {"L0_floor": "L0", "L1_floor": "L1"}
# the bare interception of a level: the same hooks, reading nothing (issue 32's floor: L1_bare's, see the doc)
BARE = {"L0_bare": "L0", "L1_bare": "L1"}
# the records floor of a level: msprobe's records of it made and written the plainest way in Python (RecordFloor)
RECORD_FLOORS = {"L0_records": "L0", "L1_records": "L1"}
# the same on the device path: values queued and reduced in batches, read back once (DeviceRecordFloor)
DEVICE_RECORD_FLOORS = {"L0_device_records": "L0", "L1_device_records": "L1"}
# a dump within this many times its level's bare interception (issue 32)
BARE_TARGET = 3.0
# --check: the kernel subtraction on a known case (see the module doc); probe -> the level it counts records of
CHECKS = {"hooks": "L0", "hooks+kernels": "L0"}

# where the device path runs summary kernels: (module, attribute) wrapped in a profiler range for the
# profiled step only (a site a checkout lacks is skipped)
KERNEL_SITES = (("msprobe.pytorch.summary.torch_kernels", "statistics"),
                ("msprobe.pytorch.summary.torch_kernels", "checksum"),
                ("msprobe.pytorch.summary.torch_kernels", "row_statistics"),
                ("msprobe.pytorch.summary.device", "DeviceSummaries._stage"),
                ("msprobe.pytorch.summary.readback", "start"))
KERNEL_RANGE = "msprobe.summary_kernels"
# ops that launch nothing on a device (views, metadata, allocations): host work wherever they run
NO_KERNEL = frozenset("aten::" + op for op in (
    "detach", "view", "reshape", "_reshape_alias", "_unsafe_view", "alias", "unbind", "select", "slice",
    "as_strided", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "flatten", "narrow",
    "view_as", "empty", "empty_strided", "empty_like", "resolve_conj", "resolve_neg", "lift_fresh"))


# The L0 floor; what msprobe adds above it was measured by knocking out one part at a time (README.md,
# "Investigations whose scripts were removed").
class HookFloor:
    """The hooks of an L0 dump: a forward hook on every submodule, a hook on the autograd node of each
    module output, a post-accumulate-grad hook on every parameter; with `read`, each reads its tensors
    once with the statistics kernel (module outputs, the module's own parameters, the gradients of the
    outputs, parameter gradients: what an L0 record holds that no other record already read)."""

    def __init__(self, read, bare=False):
        if read and not moments.ENABLED:
            raise SystemExit("msprobe's statistics kernel is not built (MSPROBE_NATIVE_STATS=0?)")
        self.read = read
        self.bare = bare  # the hooks alone: no tensor handed to _stats (not even detached for it)
        self.results = []
        self._handles = []
        self._seen = set()  # the step's reads: (address, dtype, shape, strides, version)
        # installed once and idle between steps, as msprobe's are: forward hooks read from start() to
        # stop(), gradient hooks until step() (backward may follow stop())
        self._forward_on = self._grads_on = False

    def _stats(self, t):
        if not self.read:
            return
        # a large tensor read once a step, as any dump must (a freed and reused address may be skipped: a
        # floor errs low); a small one costs less to read again than to look up
        if t.numel() >= ONCE_MIN:
            key = (t.data_ptr(), t.dtype, t.shape, t.stride(), t._version)
            if key in self._seen:
                return
            self._seen.add(key)
        self._read(t)

    def _read(self, t):
        if t.dtype is torch.float32 and t.is_contiguous() and t.numel():
            n = t.numel()
            self.results.append(moments._moments(t.data_ptr(), n, moments.KINDS["float32"],
                                                 torch.get_num_threads() if n >= _PARALLEL_MIN else 1))
        else:  # not in these models' L0 records; counted, not read
            self.results.append(None)

    def start(self, model):
        self._forward_on = self._grads_on = True
        if self._handles:
            return
        for name, mod in model.named_modules():
            if name:
                self._handles.append(mod.register_forward_hook(self._forward))
        for p in model.parameters():
            self._handles.append(p.register_post_accumulate_grad_hook(self._param_grad))

    def _param_grad(self, p):
        if self._grads_on and not self.bare:
            self._stats(p.grad)

    def _forward(self, mod, args, out):
        if not self._forward_on:
            return
        bare = self.bare
        with torch.no_grad():
            for o in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(o, torch.Tensor):
                    if not bare:
                        self._stats(o.detach())
                    if o.grad_fn is not None:
                        o.grad_fn.register_hook(self._backward)
            if bare:
                return
            for p in mod._parameters.values():
                if p is not None:
                    self._stats(p.detach())

    def _backward(self, grad_inputs, grad_outputs):
        if self.bare:
            return
        for g in grad_outputs:  # the gradients of the module's outputs; those of its inputs are the
            if g is not None:   # next module's output gradients (or the first module's input's: none)
                self._stats(g)

    def stop(self):
        self._forward_on = False

    def step(self):
        self._forward_on = self._grads_on = False
        self.results = []
        self._seen.clear()

    def close(self):
        self.step()
        for h in self._handles:
            h.remove()
        self._handles = []


class ApiFloor(HookFloor):
    """The L1 floor: a TorchFunctionMode that passes every API of msprobe's table on (the mode is off
    inside its handler, so nested calls are not seen), reading its tensor arguments and outputs once
    and hooking each output's autograd node to read the gradients once."""

    def __init__(self, bare=False):
        super().__init__(read=not bare, bare=bare)
        table = build_api_table()
        probe = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func not in table:
                    return func(*args, **kwargs)
                if bare:  # pass it on, hook its output's node: nothing else
                    out = func(*args, **kwargs)
                    if isinstance(out, torch.Tensor) and out.grad_fn is not None:
                        out.grad_fn.register_hook(probe._backward)
                    return out
                for a in args:
                    if type(a) is torch.Tensor or type(a) is nn.Parameter:
                        probe._stats(a.detach())
                out = func(*args, **kwargs)
                if isinstance(out, torch.Tensor):
                    probe._stats(out.detach())
                    if out.grad_fn is not None:
                        out.grad_fn.register_hook(probe._backward)
                return out

        self._mode = Mode()

    def start(self, model):
        self._mode.__enter__()

    def stop(self):
        self._mode.__exit__(None, None, None)

    def _read(self, t):
        super()._read(t if t.is_contiguous() else memory_order(t))  # a weight's gradient comes transposed

    def _backward(self, grad_inputs, grad_outputs):
        if self.bare:
            return
        for g in (*grad_inputs, *grad_outputs):
            if g is not None:
                self._stats(g)


class _Records:
    """What both records floors share: a step's records, a record per tensor read (shared by every record of
    that tensor while it is unchanged), and at step() each file written with one orjson call into a new step
    directory, on a thread of the floor's own. Mixed into a floor (HookFloor's hooks and reads)."""

    LEVEL = None
    _writer = None  # (made at the first step: a thread of its own)
    _written = ()  # the steps' writes handed to it, not waited for yet

    def _reset(self):
        self.data, self.construct, self.counts = {}, {}, {}
        self._recs = {}  # id(tensor) -> (tensor, version, record): the tensor is kept, so its id stays its own

    def _record(self, t):
        hit = self._recs.get(id(t))
        if hit is not None and hit[0] is t and hit[1] == t._version:
            return hit[2]
        rec = {"type": "torch.Tensor", "dtype": str(t.dtype), "shape": list(t.shape)}
        self._statistics(t, rec)
        rec["requires_grad"] = t.requires_grad  # (other dtypes and layouts: no statistics; a floor errs low)
        self._recs[id(t)] = (t, t._version, rec)
        return rec

    def _statistics(self, t, rec):
        """`t`'s statistics into its record `rec`, read now with msprobe's kernel."""
        kind = moments.KINDS.get(rec["dtype"][6:])
        if kind is not None and t.layout is torch.strided and t.is_cpu and t.numel():
            dense = t
            if not t.is_contiguous():
                dense = memory_order(t.detach())  # (a weight's gradient may come transposed)
                if not dense.is_contiguous():  # (msprobe reads such a view in place; a floor may copy it)
                    dense = dense.contiguous()
            n = dense.numel()
            got = moments._moments(dense.data_ptr(), n, kind, torch.get_num_threads() if n >= _PARALLEL_MIN else 1)
            if got is not None:  # (a NaN or inf: no statistics, a floor errs low)
                rec.update(Max=got[0], Min=got[1], Mean=got[2], Norm=got[3])

    def _value(self, v):
        """The record of an argument or result: a tensor's, a Python scalar's, a list of a sequence's, None;
        anything else by its type and text."""
        if isinstance(v, torch.Tensor):
            return self._record(v)
        if v is None:
            return None
        if isinstance(v, (bool, int, float, str)):
            return {"type": type(v).__name__, "value": v}
        if isinstance(v, (tuple, list)):
            return [self._value(x) for x in v]
        return {"type": type(v).__name__, "value": str(v)}

    def _key(self, name):
        n = self.counts.get(name, 0)
        self.counts[name] = n + 1
        return f"{name}.{n}"

    def _write(self):
        """The step's files, written by one thread of the floor's own while training goes on (msprobe makes its
        directories and writes its files on its writer's threads: a floor does no less off the training
        thread); flush() and close() wait for them."""
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="records-floor")
        self._written += (self._writer.submit(
            self._write_files, os.path.join(self.root, f"step{self.steps}", "rank0"),
            {"task": "statistics", "level": self.LEVEL, "framework": "pytorch", "dump_data_dir": None,
             "data": self.data}, self.construct),)
        self.steps += 1
        self._reset()

    @staticmethod
    def _write_files(folder, dump, construct):
        os.makedirs(folder)
        with open(os.path.join(folder, "dump.json"), "wb") as f:
            f.write(orjson.dumps(dump))
        with open(os.path.join(folder, "construct.json"), "wb") as f:
            f.write(orjson.dumps(construct))

    def flush(self):
        """Wait for the steps' files (a write that failed raises here)."""
        written, self._written = self._written, ()
        for done in written:
            done.result()

    def close(self):
        super().close()
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        self.flush()


class RecordFloor(_Records, HookFloor):
    """The L0 records floor: msprobe's L0 records of the model, made and written the plainest way in Python —
    the floor's hooks and one read of each tensor, plus a pre-hook per module (its key, its parent, its
    inputs), a key per call from a counter per name, a dict per tensor read, a record per forward call,
    backward call and module's parameter gradients, construct.json's parents, and at step() one orjson call
    a file. Nothing a dump needs beyond its records (crash-safe appends, a flush by time, stack.json,
    filters, the device path; statistics of a dtype or layout the kernel does not read) is there. Its
    dump.json and construct.json equal msprobe's L0 dump of host_cost.py's MLP (tests/benchmarks)."""

    LEVEL = "L0"

    def __init__(self, root):
        super().__init__(read=True)
        self.root, self.steps = root, 0
        self._names = {}  # module -> (its forward key without the index, its parameters_grad key)
        self._reset()

    def _reset(self):
        super()._reset()
        self.stack = []  # (key, backward record) of the modules running
        self._consumers = {}  # id(tensor) -> the backward "output" lists its gradient goes into

    def start(self, model):
        self._forward_on = self._grads_on = True
        if self._handles:
            return
        for name, mod in model.named_modules():
            if not name:
                continue
            base = f"Module.{name}.{type(mod).__name__}"
            self._names[mod] = (base + ".forward", base + ".parameters_grad.0")
            self._handles += [mod.register_forward_pre_hook(self._pre), mod.register_forward_hook(self._forward)]
            for pname, p in mod._parameters.items():
                if p is not None:
                    self._handles.append(p.register_post_accumulate_grad_hook(
                        functools.partial(self._grad_of_param, self._names[mod][1], pname)))

    def _pre(self, mod, args):
        if not self._forward_on:
            return
        key = self._key(self._names[mod][0])
        parent = self.stack[-1][0] if self.stack else None
        backward = {"input": [], "output": []}  # (filled as the gradients come)
        self.construct[key] = parent
        self.stack.append((key, backward))
        inputs = []
        with torch.no_grad():
            for a in args:
                if isinstance(a, torch.Tensor):
                    inputs.append(self._record(a))
                    if a.requires_grad:  # its gradient: what this module's backward gives ("output")
                        self._consumers.setdefault(id(a), []).append(backward["output"])
                    else:  # none comes
                        backward["output"].append(None)
        self.data[key] = {"input_args": inputs, "input_kwargs": {}}

    def _forward(self, mod, args, out):
        if not self._forward_on:
            return
        key, backward = self.stack.pop()
        rec = self.data[key]
        outs = out if isinstance(out, (tuple, list)) else (out,)
        with torch.no_grad():
            rec["output"] = [self._record(o) for o in outs if isinstance(o, torch.Tensor)]
            rec["parameters"] = {n: self._record(p) for n, p in mod._parameters.items() if p is not None}
        bkey = key.replace(".forward.", ".backward.")
        parent = self.stack[-1][0] if self.stack else None
        self.construct[bkey] = parent and parent.replace(".forward.", ".backward.")
        for o in outs:
            if isinstance(o, torch.Tensor) and o.grad_fn is not None:  # (o is kept by _recs: its id stays)
                o.grad_fn.register_hook(functools.partial(self._gradients, bkey, backward, id(o)))

    def _gradients(self, bkey, backward, out_id, grad_inputs, grad_outputs):
        """A module's output gradient: its backward record's "input" (the record is in the dump from now on),
        and the "output" of the backward records of the modules that took its output."""
        if not self._grads_on:
            return
        self.data[bkey] = backward
        for g in grad_outputs:
            if g is not None:
                rec = self._record(g)
                backward["input"].append(rec)
                for given in self._consumers.get(out_id, ()):
                    given.append(rec)

    def _grad_of_param(self, key, name, p):
        if not self._grads_on:
            return
        rec = self.data.get(key)
        if rec is None:
            rec = self.data[key] = {}
        rec[name] = [self._record(p.grad)]

    def step(self):
        self._write()
        super().step()


class ApiRecordFloor(_Records, ApiFloor):
    """The L1 records floor: msprobe's L1 records of the model made the plainest way in Python, on the L1
    floor's mode — a key per API call (msprobe's table names it), its argument and result records, a node
    hook for its backward record, and an optimizer step's update record per parameter (global optimizer
    step hooks: the parameter and its gradient before, the parameter after); written as RecordFloor writes.
    Its forward and update records equal msprobe's L1 dump of the same step, and so do its backward records'
    gradients of the outputs; their gradients of the inputs are the node's as it hands them on (F.linear's:
    bias, input, the weight's transpose), where msprobe's map them to the call's arguments (tests/benchmarks).
    No stack.json."""

    LEVEL = "L1"

    def __init__(self, root):
        HookFloor.__init__(self, read=True)
        self.root, self.steps = root, 0
        self._reset()
        self._param_names = {}  # id(parameter) -> its name in the model
        self._busy = False  # in the floor's own hooks: the mode passes calls on
        table = build_api_table()
        probe = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                api = table.get(func)
                if api is None or probe._busy:  # (the floor's own calls in its hooks)
                    return func(*args, **(kwargs or {}))
                return probe._call(api, func, args, kwargs or {})

        self._mode = Mode()

    def _call(self, api, func, args, kwargs):
        key = self._key(f"{api[0]}.{api[1]}")
        with torch.no_grad():
            rec = {"input_args": [self._value(a) for a in args],
                   "input_kwargs": {k: self._value(v) for k, v in kwargs.items()}}
        out = func(*args, **kwargs)
        with torch.no_grad():
            rec["output"] = [self._value(o) for o in (out if isinstance(out, (tuple, list)) else (out,))]
        self.data[key + ".forward"] = rec
        if isinstance(out, torch.Tensor) and out.grad_fn is not None:
            out.grad_fn.register_hook(functools.partial(self._gradients, key + ".backward"))
        return out

    @contextlib.contextmanager
    def _own_work(self):
        """The floor's reads in its hooks: not recorded by its mode, outside autograd."""
        self._busy = True
        try:
            with torch.no_grad():
                yield
        finally:
            self._busy = False

    def _gradients(self, bkey, grad_inputs, grad_outputs):
        if self._grads_on:
            with self._own_work():
                self.data[bkey] = {"input": [self._value(g) for g in grad_outputs],
                                   "output": [self._value(g) for g in grad_inputs]}

    def start(self, model):
        self._forward_on = self._grads_on = True
        if not self._handles:
            self._param_names = {id(p): name for name, p in model.named_parameters()}
            self._handles = [register_optimizer_step_pre_hook(self._before_update),
                             register_optimizer_step_post_hook(self._after_update)]
        self._mode.__enter__()

    def _updated(self, opt):
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None and id(p) in self._param_names:
                    yield p, f"Optimizer.{type(opt).__name__}.{self._param_names[id(p)]}"

    def _before_update(self, opt, args, kwargs):
        if self._grads_on:
            with self._own_work():
                for p, name in self._updated(opt):
                    self.data[self._key(name) + ".forward"] = {"input_args": [self._record(p), self._record(p.grad)],
                                                              "input_kwargs": {}}

    def _after_update(self, opt, args, kwargs):
        if self._grads_on:
            with self._own_work():
                for p, name in self._updated(opt):
                    self.data[f"{name}.{self.counts[name] - 1}.forward"]["output"] = [self._record(p)]

    def stop(self):
        self._mode.__exit__(None, None, None)

    def step(self):
        self._write()
        super().step()


class _DeviceReads:
    """The device path's part of a records floor, mixed in before it: a tensor's statistics are not read at its
    record but queued (its record's value fields null until then) and reduced in batches — the tensors of one
    shape stacked, four reductions, one read back — before anything changes them in place (an
    optimizer update, an in-place API) and at step(). Values a module's own code may change before any hook
    sees it (an L0 forward record's: ResNet's `out += identity`) are copied at the hook, a launch each, as
    msprobe's staging copies them; the rest are held as they are. The copy and the reductions are the probe's
    `kernel_sites`: device time on an accelerator, subtracted as msprobe's kernels are (module doc)."""

    def _reset(self):
        super()._reset()
        self._waiting = []  # (tensor, record) whose statistics are not read yet
        self._copying = False  # in a forward hook of an L0 floor: values taken now

    @property
    def kernel_sites(self):
        return ((_DeviceReads, "_take"), (_DeviceReads, "_reduce_all"))

    def _statistics(self, t, rec):
        """`t` queued: its record's value fields null until its batch is read."""
        if t.dtype is torch.float32 and t.layout is torch.strided and t.numel():  # (the MLP's: a floor errs low)
            rec.update(Max=None, Min=None, Mean=None, Norm=None)
            self._waiting.append((self._take(t) if self._copying else t, rec))

    def _take(self, t):
        return t.detach().clone()

    @contextlib.contextmanager
    def _copies(self):
        """Within it (a forward hook of an L0 floor) a value is copied as it is queued."""
        self._copying = True
        try:
            yield
        finally:
            self._copying = False

    def _reduce(self, xs):
        """(k, 4) Max/Min/Mean/Norm of k float32 tensors of one shape: float64 sums, Mean and Norm in float32
        precision, as msprobe's device path reports them."""
        m = torch.stack(xs).reshape(len(xs), -1).to(torch.float64)
        mean_norm = (m.sum(1) / m.shape[1], (m * m).sum(1).sqrt())
        return torch.stack((m.amax(1), m.amin(1), *(v.to(torch.float32).to(torch.float64) for v in mean_norm)), dim=1)

    def _reduce_all(self, batches):
        return torch.cat([self._reduce(xs) for xs in batches])

    def _resolve(self):
        waiting, self._waiting = self._waiting, []
        if not waiting:
            return
        groups = {}
        for x, rec in waiting:
            group = groups.get(x.shape)
            if group is None:
                groups[x.shape] = group = ([], [])
            group[0].append(x)
            group[1].append(rec)
        with torch.no_grad():
            rows = self._reduce_all([xs for xs, _ in groups.values()]).tolist()
        for rec, (mx, mn, mean, norm) in zip((rec for _, recs in groups.values() for rec in recs), rows):
            rec["Max"], rec["Min"], rec["Mean"], rec["Norm"] = mx, mn, mean, norm


class DeviceRecordFloor(_DeviceReads, RecordFloor):
    """The L0 records floor on the device path: RecordFloor's records, a forward value copied at its hook and
    a gradient held, all reduced at step() (_DeviceReads)."""

    def _pre(self, mod, args):
        with self._copies():
            super()._pre(mod, args)

    def _forward(self, mod, args, out):
        with self._copies():
            super()._forward(mod, args, out)

    def step(self):
        self._resolve()
        super().step()


class DeviceApiRecordFloor(_DeviceReads, ApiRecordFloor):
    """The L1 records floor on the device path: ApiRecordFloor's records, every value held (the mode sees
    every call that may change one), reduced before an in-place API, before the optimizer updates and at
    step() (_DeviceReads)."""

    def _reset(self):
        super()._reset()
        self._addresses = set()  # where the waiting tensors' data start

    def _statistics(self, t, rec):
        waiting = len(self._waiting)
        super()._statistics(t, rec)
        if len(self._waiting) > waiting:
            self._addresses.add(t.data_ptr())

    def _resolve(self):
        super()._resolve()
        self._addresses.clear()

    def _call(self, api, func, args, kwargs):
        # an in-place API (an optimizer's `p.add_`): the tensor it changes is recorded first (its record is the
        # call's input), and its values are read before the call if they wait
        if api[1].endswith("_") and not api[1].endswith("__") and args and isinstance(args[0], torch.Tensor):
            with torch.no_grad():
                self._record(args[0])
            if args[0].data_ptr() in self._addresses:
                self._resolve()
        return super()._call(api, func, args, kwargs)

    def _before_update(self, opt, args, kwargs):
        super()._before_update(opt, args, kwargs)
        with self._own_work():
            self._resolve()

    def step(self):
        with self._own_work():
            self._resolve()
        super().step()


class KernelProbe(HookFloor):
    """--check's known case: the L0 hooks, each hooked tensor answered by one float64 reduction of
    KNOWN_ELEMENTS elements inside a kernel range: all it adds to the hooks alone is that op (its Python
    call, dispatch and compute), which the kernel subtraction must take out."""

    KNOWN_ELEMENTS = 1 << 16

    def __init__(self):
        super().__init__(read=False)
        self._work = torch.randn(self.KNOWN_ELEMENTS, dtype=torch.float64)
        self.kernel_sites = ((self, "_reduce"),)

    def _stats(self, t):
        self.results.append(self._reduce())

    def _reduce(self):
        return self._work.sum()


def bare_probe(level):
    """The bare interception of `level`: its floor's hooks, reading nothing (debugger-shaped)."""
    return HookFloor(read=False, bare=True) if level == "L0" else ApiFloor(bare=True)


def floor_probe(level):
    """The floor of `level` ("L0" or "L1"): debugger-shaped (start(model), stop(), step(), close())."""
    return HookFloor(read=True) if level == "L0" else ApiFloor()


def _probe(root, name):
    """What a config times: msprobe's debugger, or a floor probe."""
    if name in FLOORS:
        return floor_probe(FLOORS[name])
    if name in BARE:
        return bare_probe(BARE[name])
    if name in RECORD_FLOORS:
        return (RecordFloor if RECORD_FLOORS[name] == "L0" else ApiRecordFloor)(os.path.join(root, name))
    if name in DEVICE_RECORD_FLOORS:
        return (DeviceRecordFloor if DEVICE_RECORD_FLOORS[name] == "L0" else DeviceApiRecordFloor)(
            os.path.join(root, name))
    if name in CHECKS:
        return KernelProbe() if name == "hooks+kernels" else HookFloor(read=False)
    return _debugger(root, name)


def _in_range(fn):
    @functools.wraps(fn)
    def ranged(*args, **kwargs):
        with record_function(KERNEL_RANGE):
            return fn(*args, **kwargs)
    return ranged


@contextlib.contextmanager
def _kernel_ranges(extra=()):
    """KERNEL_SITES (and `extra`: (object, attribute) pairs) each in a KERNEL_RANGE profiler range, undone
    on exit."""
    sites = []
    for module, attr in KERNEL_SITES:
        try:
            owner = importlib.import_module(module)
        except ImportError:
            continue
        *path, attr = attr.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        if owner is not None and hasattr(owner, attr):
            sites.append((owner, attr))
    sites += list(extra)
    saved = [(owner, attr, vars(owner).get(attr, _ABSENT)) for owner, attr in sites]  # (an instance's: absent)
    try:
        for owner, attr in sites:
            setattr(owner, attr, _in_range(getattr(owner, attr)))
        yield
    finally:
        for owner, attr, old in reversed(saved):
            if old is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)


_ABSENT = object()


def kernel_time(events):
    """(µs, ops) of the profiled aten ops inside KERNEL_RANGE ranges, NO_KERNEL aside: their self time (an
    op's own, not its children's), and how many the Python code called (those under no other such op:
    a launch each, at least, on a device)."""
    us, ops = 0.0, 0
    for e in events:
        if not e.name.startswith("aten::") or e.name in NO_KERNEL:
            continue
        outermost, parent = True, e.cpu_parent
        while parent is not None and parent.name != KERNEL_RANGE:
            outermost = outermost and not (parent.name.startswith("aten::") and parent.name not in NO_KERNEL)
            parent = parent.cpu_parent
        if parent is not None:
            us += e.self_cpu_time_total
            ops += outermost
    return us, ops


def _profiled_step(model, x, opt, probe):
    """(kernel seconds, kernel ops) of one dumped step run under the profiler (kernel_time). The profiler
    times ops by the clock; with --cpu the kernel time is scaled by the share of the step the training
    thread was on a CPU (on a loaded machine the clock also counts the time it waited for one)."""
    gc.collect()
    # msprobe._record copies a tensor into its staging row itself, outside the Python kernel sites: this step's
    # session takes the Python path, which runs the same kernels inside them (records are the same either way)
    native = os.environ.get("MSPROBE_NATIVE_RECORD")
    os.environ["MSPROBE_NATIVE_RECORD"] = "0"
    try:
        with _kernel_ranges(getattr(probe, "kernel_sites", ())):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                c0, t0 = time.thread_time(), time.perf_counter()
                _train(model, x, opt, probe)
                on_cpu = (time.thread_time() - c0) / (time.perf_counter() - t0)
    finally:
        if native is None:
            os.environ.pop("MSPROBE_NATIVE_RECORD", None)
        else:
            os.environ["MSPROBE_NATIVE_RECORD"] = native
    us, ops = kernel_time(prof.events())
    return us * 1e-6 * (min(1.0, on_cpu) if METRIC == harness.CPU else 1.0), ops


def build(depth=48, width=32, device="cpu", seq=0):
    """The MLP and its input: [4, width], or with `seq` [4, seq, width] (a transformer's batch, sequence and
    features: F.linear flattens it into one product and views the product back)."""
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers).to(device), torch.randn(4, *((seq,) if seq else ()), width, device=device)


def _sync(x):
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def _debugger(root, name):
    level, summary, device = CONFIGS[name]
    os.environ["MSPROBE_DEVICE_SUMMARY"] = "1" if device else "0"
    path = os.path.join(root, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"task": "statistics", "level": level, "dump_path": os.path.join(root, name),
                   "statistics": {"summary_mode": summary}}, f)
    return PrecisionDebugger(config_path=path)


# the measure of a step: wall seconds, or process CPU seconds (--cpu: steadier on a shared machine)
METRIC = harness.WALL


# the parts of a step timed apart (`_step`): where a config's time goes, against its floor's
PHASES = ("start", "forward+backward", "optimizer", "stop+step")


def _step(model, x, opt, dbg=None):
    """Seconds (METRIC) of each of the PHASES of one training step with `dbg` (if any) around it."""
    gc.collect()
    clock = time.perf_counter if METRIC == harness.WALL else time.process_time
    marks = [clock()]
    _train(model, x, opt, dbg, lambda: marks.append(clock()))
    marks.append(clock())
    return [b - a for a, b in zip(marks, marks[1:])]


def _no_mark():
    pass


def _train(model, x, opt, dbg, mark=_no_mark):
    """One training step; `mark()` between the PHASES."""
    if dbg is not None:
        dbg.start(model)
    mark()
    model(x).square().mean().backward()
    mark()
    opt.step()
    mark()
    opt.zero_grad(set_to_none=True)
    if dbg is not None:
        dbg.stop()
        dbg.step()
    _sync(x)


def _records(dump_path):
    """(records, tensor records) of the last step dumped."""
    last = max(find_rank_dirs(dump_path), key=lambda r: r.step)
    with open(os.path.join(last.path, "dump.json"), encoding="utf-8") as f:
        data = json.load(f)["data"]
    return len(data), sum(1 for v in data.values() for _ in iter_tensor_records(v))


def measure(configs, rounds, steps, log, device="cpu", seq=0):
    """Interleaved: a round times every config in turn (the order rotated each round), each in a slot of
    its own: a fresh debugger or floor probe, one untimed step, `steps` plain steps and `steps` dumped
    ones, then closed (no idle hook of it left on the shared model for the next slot). A config and its
    level's floor are so measured minutes apart at most, whatever the machine's load does meanwhile.
    Records are counted after the rounds, in one untimed step of a debugger at each config's level."""
    model, x = build(device=device, seq=seq)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    root = tempfile.mkdtemp(prefix="msprobe_host_cost_")
    got = {name: {"ratios": [], "extra": [], "kernels": [], "phases": []} for name in configs}
    out = {}
    try:
        with harness.young_heap():  # (each step's collection walks only what was made since)
            for r in range(rounds):
                for name in configs[r % len(configs):] + configs[:r % len(configs)]:
                    _slot(model, x, opt, os.path.join(root, f"r{r}"), name, steps, device, got[name],
                          first=r == 0)
                shutil.rmtree(os.path.join(root, f"r{r}"), ignore_errors=True)
                log(f"round {r + 1}/{rounds} done")
            counted = {}
            for name in configs:
                level = (FLOORS.get(name) or RECORD_FLOORS.get(name) or DEVICE_RECORD_FLOORS.get(name) or BARE.get(name)
                         or CHECKS.get(name) or name)
                if level not in counted:  # the records msprobe writes at that level, in one untimed step
                    probe = _debugger(root, level)
                    _step(model, x, opt, probe)
                    probe.close()
                    counted[level] = _records(os.path.join(root, level))
                records, tensors = counted[level]
                g = got[name]
                extra = statistics.median(g["extra"])
                res = out[name] = {"records": records, "tensors": tensors, "extra_ms": 1e3 * extra,
                                   "us_per_record": 1e6 * extra / records, "us_per_tensor": 1e6 * extra / tensors,
                                   "ratio": statistics.median(g["ratios"]),
                                   "phases_ms": {ph: 1e3 * statistics.median(p[i] for p in g["phases"])
                                                 for i, ph in enumerate(PHASES)}}
                if g["kernels"]:
                    kernel_s = statistics.median(k for k, _ in g["kernels"])
                    res.update(kernel_ms=1e3 * kernel_s,
                               kernels_per_record=statistics.median(n for _, n in g["kernels"]) / records,
                               host_us_per_record=1e6 * (extra - kernel_s) / records)
                log(f"{name}: {res['us_per_record']:.1f} us/record"
                    + (f", host {res['host_us_per_record']:.1f}" if g["kernels"] else ""))
    finally:
        os.environ.pop("MSPROBE_DEVICE_SUMMARY", None)
        shutil.rmtree(root, ignore_errors=True)
    return out


def _slot(model, x, opt, root, name, steps, device, got, first=False):
    """One config's slot of a round (see measure): its step ratio, extra seconds and phases into `got`."""
    os.makedirs(root, exist_ok=True)
    probe = _probe(root, name)
    try:
        for _ in range(2 if first else 1):  # warm-up: API table, first-call caches, hooks installed
            _step(model, x, opt, probe)
        plain = [_step(model, x, opt) for _ in range(steps)]
        dumped = [_step(model, x, opt, probe) for _ in range(steps)]
        got["extra"].append(statistics.median(map(sum, dumped)) - statistics.median(map(sum, plain)))
        got["ratios"].append(statistics.median(map(sum, dumped)) / statistics.median(map(sum, plain)))
        got["phases"].append([statistics.median(d[i] for d in dumped) - statistics.median(p[i] for p in plain)
                              for i in range(len(PHASES))])
        # the kernels' share of a step (module doc): the device path's on the CPU, and --check's
        if device == "cpu" and (name in CHECKS or name in DEVICE_RECORD_FLOORS
                                or (name in CONFIGS and CONFIGS[name][2])):
            got["kernels"].append(_profiled_step(model, x, opt, probe))
    finally:
        probe.close()


def summary_cost(n=3000, device="cpu"):
    """µs per Summarizer.summarize of a fresh 32x32 float32 tensor: host path, device path (+ resolve);
    on CUDA the device path alone (the one a CUDA tensor takes); and of the same tensor objects again
    (the per-object table's hit: an API's input that was the previous API's output) on the host path."""
    got = {}
    paths = (("cuda", True),) if device == "cuda" else (("host", False), ("device", True))
    with CollectorPause():  # as a debugger runs (core/gc_pause.py): else a collection walks the 3000 tensors
        for label, device_path in paths:
            _summary_cost(label, device_path, n, device, got)
    return got


def _summary_cost(label, device_path, n, device, got):
    """summary_cost's measure of one path into `got`."""
    s = Summarizer(device_path=device_path)
    tensors = [torch.randn(32, 32, device=device) for _ in range(n)]
    t0 = time.perf_counter()
    for t in tensors:
        s.summarize(t, defer=True)
    s.start_resolve().finish()
    got[label] = 1e6 * (time.perf_counter() - t0) / n
    if label == "host":
        t0 = time.perf_counter()
        for t in tensors:
            s.summarize(t, defer=True)
        got["host object-hit"] = 1e6 * (time.perf_counter() - t0) / n


def render(results, per_summary):
    floors = {FLOORS[c]: r["us_per_record"] for c, r in results.items() if c in FLOORS}
    lines = [f"{'config':<14}{'records':>8}{'tensors':>8}{'extra ms':>10}{'us/record':>11}{'us/tensor':>11}"
             f"{'step ratio':>12}{'kernels/rec':>12}{'host us/rec':>12}{'above floor':>13}",
             "-" * 111]
    for name, r in results.items():
        mark = "!" if r["us_per_record"] > TARGET_US_PER_RECORD else " "
        floor = floors.get(CONFIGS[name][0]) if name in CONFIGS else None
        above = "" if floor is None else f"{r['us_per_record'] - floor:>12.1f}"
        host = (f"{r['kernels_per_record']:>12.2f}{r['host_us_per_record']:>12.1f}" if "host_us_per_record" in r
                else f"{'-':>12}{'-':>12}")
        lines.append(f"{name:<14}{r['records']:>8}{r['tensors']:>8}{r['extra_ms']:>10.2f}"
                     f"{r['us_per_record']:>10.1f}{mark}{r['us_per_tensor']:>11.1f}{r['ratio']:>11.2f}x{host}{above}")
    lines.append(f"target: <= {TARGET_US_PER_RECORD:g} us per record (!: over)")
    if any("host_us_per_record" in r for r in results.values()):
        lines.append("host us/rec: us/record less the summary kernels' self time (device time on an accelerator; "
                     "profiled, see the module doc); kernels/rec: their ops a record, each a launch on a device")
    if "hooks" in results and "hooks+kernels" in results:
        known, got = results["hooks"], results["hooks+kernels"]
        lines.append(f"check: hooks alone {known['us_per_record']:.1f} us/record; hooks+kernels "
                     f"{got['us_per_record']:.1f}, less its kernels {got['host_us_per_record']:.1f} (expected: "
                     f"{known['us_per_record']:.1f} plus the Python of {got['kernels_per_record']:.2f} calls a record; "
                     f"off by {got['host_us_per_record'] - known['us_per_record']:+.1f})")
    bare = {BARE[c]: r["us_per_record"] for c, r in results.items() if c in BARE}
    if bare:
        within = [f"{name} {r['us_per_record'] / bare[CONFIGS[name][0]]:.1f}x"
                  + ("!" if r["us_per_record"] > BARE_TARGET * bare[CONFIGS[name][0]] else "")
                  for name, r in results.items() if name in CONFIGS and CONFIGS[name][0] in bare]
        lines.append("bare interception (the hooks alone, reading nothing): "
                     + ", ".join(f"{level} {us:.1f} us per record" for level, us in bare.items())
                     + (f"; msprobe over it: {', '.join(within)} (target <= {BARE_TARGET:g}x, !: over)" if within
                        else ""))
    if "L1_bare" in results:
        lines.append(_issue_bare_line(results))
    for line in (_records_floor_line(results), _device_records_floor_line(results)):
        if line:
            lines.append(line)
    if floors:
        lines.append("floor: " + ", ".join(f"{level} {us:.1f} us per record" for level, us in floors.items())
                     + " (hooks, each tensor read once; records and tensors are msprobe's at that level): the "
                     "target is " + ("below" if min(floors.values()) > TARGET_US_PER_RECORD else "above")
                     + " the least a Python hook-based dump costs here")
    lines += _phase_table(results)
    if per_summary:
        lines.append("Summarizer.summarize of a fresh 32x32 tensor (object-hit: the same tensor again): "
                     + ", ".join(f"{k} path {v:.1f} us" for k, v in per_summary.items()))
    return "\n".join(lines)


def _host_us(r):
    """A config's µs per record on the host: its host part where its kernels were subtracted (the device path
    on the CPU), else all of it."""
    return r.get("host_us_per_record", r["us_per_record"])


def _issue_bare_line(results):
    """The bare interception as issue 32 measures it: one TorchFunctionMode passing every call on and
    hooking each output's node (L1_bare), whatever the level, over the records of each config's level; a
    device config against its host part."""
    mode_ms = results["L1_bare"]["extra_ms"]
    within = []
    for name, r in results.items():
        if name not in CONFIGS:
            continue
        over = _host_us(r) * r["records"] / (1e3 * mode_ms)
        within.append(f"{name} {over:.1f}x" + ("!" if over > BARE_TARGET else ""))
    per_level = {}
    for name, r in results.items():
        if name in CONFIGS:
            per_level.setdefault(CONFIGS[name][0], 1e3 * mode_ms / r["records"])
    return ("bare interception as issue 32 defines it (L1_bare's mode, whatever the level, over the level's "
            "records): " + ", ".join(f"{level} {us:.1f} us per record" for level, us in per_level.items())
            + (f"; msprobe over it (device configs: their host part): {', '.join(within)} "
               f"(target <= {BARE_TARGET:g}x, !: over)" if within else ""))


def _records_floor_line(results):
    """msprobe's configs against the records floor of their level (RecordFloor; a device config by its host
    part), or None when none was measured."""
    floors = {RECORD_FLOORS[c]: r["us_per_record"] for c, r in results.items() if c in RECORD_FLOORS}
    if not floors:
        return None
    over = [f"{name} {_host_us(r) / floors[CONFIGS[name][0]]:.2f}x"
            for name, r in results.items() if name in CONFIGS and CONFIGS[name][0] in floors]
    return ("records floor (msprobe's records of the level, made and written the plainest way in Python: the "
            "floor's hooks and reads, a dict a tensor and a record a call, one orjson call a file at step() on a "
            "thread of its own; no crash safety, stack.json or filters): " + ", ".join(f"{level} {us:.1f} us per record"
                                                               for level, us in floors.items())
            + (f"; msprobe over it (device configs: their host part): {', '.join(over)}" if over else ""))


def _device_records_floor_line(results):
    """The device records floor's host part per record (DeviceRecordFloor) against msprobe's device configs'
    host part and its CPU path's cost, level by level; None when none was measured."""
    floors = {DEVICE_RECORD_FLOORS[c]: _host_us(r) for c, r in results.items() if c in DEVICE_RECORD_FLOORS}
    if not floors:
        return None
    device = [f"{name} {_host_us(r) / floors[CONFIGS[name][0]]:.2f}x"
              for name, r in results.items() if name in CONFIGS and CONFIGS[name][2] and CONFIGS[name][0] in floors]
    host = [f"{name} {r['us_per_record'] / floors[CONFIGS[name][0]]:.2f}x"
            for name, r in results.items() if name in CONFIGS and not CONFIGS[name][2] and CONFIGS[name][0] in floors]
    return ("device records floor (the records floor with its reads queued and reduced in batches, an L0 forward "
            "value copied at its hook; host part): " + ", ".join(f"{level} {us:.1f} us per record"
                                                                 for level, us in floors.items())
            + (f"; msprobe's device path (host part) over it: {', '.join(device)}" if device else "")
            + (f"; msprobe's CPU path over it: {', '.join(host)} (below 1: the CPU path costs less than the "
               f"plainest device-path dump's host part)" if host else ""))


def _phase_table(results):
    """Lines of the extra ms a step each config adds in each of the PHASES, and how far above its level's
    floor (in parentheses) where that floor was measured: which part of a step a dump's cost is in."""
    floors = {FLOORS[c]: r["phases_ms"] for c, r in results.items() if c in FLOORS and "phases_ms" in r}
    rows = [(name, r["phases_ms"], floors.get(CONFIGS[name][0]) if name in CONFIGS else None)
            for name, r in results.items() if "phases_ms" in r]
    if not rows:
        return []
    lines = ["", "extra ms a step by phase (median over rounds; in parentheses: above the level's floor)",
             f"{'config':<14}" + "".join(f"{ph:>20}" for ph in PHASES), "-" * (14 + 20 * len(PHASES))]
    for name, got, floor in rows:
        cells = [f"{got[ph]:.2f}" + (f" ({got[ph] - floor[ph]:+.2f})" if floor else "") for ph in PHASES]
        lines.append(f"{name:<14}" + "".join(f"{c:>20}" for c in cells))
    return lines


def _child_run(src, configs, rounds, steps, threads, device, seq=0):
    """One measurement in a fresh process whose msprobe comes from `src` (None: this checkout's)."""
    fd, out = tempfile.mkstemp(suffix=".json", prefix="msprobe_host_cost_")
    os.close(fd)
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, os.path.abspath(__file__), "--configs", ",".join(configs), "--rounds", str(rounds),
           "--steps", str(steps), "--threads", str(threads), "--device", device, "--json", out, "--no-summary-cost",
           "--seq", str(seq)]
    if METRIC == harness.CPU:
        cmd.append("--cpu")
    try:
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(out, encoding="utf-8") as f:
            return json.load(f)
    finally:
        os.unlink(out)


def compare_with(src, configs, rounds, steps, threads, alternations, log, device="cpu", seq=0):
    """(ours, baseline, the baseline's msprobe folder as its run imported it): per config the µs per record
    of each alternation, this checkout's run first."""
    # (a device config's host part, less its kernels, is a row of its own: "<config> host")
    ours, base = {}, {}
    imported = None
    for i in range(alternations):
        for side, path in ((ours, None), (base, src)):
            got = _child_run(path, configs, rounds, steps, threads, device, seq)
            for c in configs:
                r = got["results"][c]
                side.setdefault(c, []).append(r["us_per_record"])
                if "host_us_per_record" in r:
                    side.setdefault(f"{c} host", []).append(r["host_us_per_record"])
            if path is not None:
                imported = got["msprobe"]
        log(f"alternation {i + 1}/{alternations}: " + ", ".join(
            f"{c} {ours[c][-1]:.1f} vs {base[c][-1]:.1f}" for c in ours if c in base))
    return ours, base, imported


class Toggle:
    """A --toggle: `MODULE.ATTR=A,B[,...]` (the values read as Python literals) or `env:NAME=A,B[,...]`
    (strings); `set(v)` sets it, `restore()` puts back what was there."""

    def __init__(self, text):
        target, sep, listed = text.partition("=")
        values = [v.strip() for v in listed.split(",")] if sep else []
        if not target or len(values) < 2 or not all(values):
            raise ValueError(f"got {text!r}; allowed: MODULE.ATTR=A,B or env:NAME=A,B (two values or more)")
        self.target = target
        if target.startswith("env:"):
            self.env = target[4:]
            if not self.env:
                raise ValueError(f"got {text!r}: no variable name after env:")
            self.values, self.original = values, os.environ.get(self.env)
            return
        self.env = None
        module_name, _, self.attr = target.rpartition(".")
        try:
            self.module = importlib.import_module(module_name) if module_name else None
        except ImportError as e:
            raise ValueError(f"got {text!r}: module {module_name!r} does not import ({e})") from None
        if self.module is None or not hasattr(self.module, self.attr):
            raise ValueError(f"got {text!r}: {module_name or '(no module)'} has no attribute {self.attr!r}")
        try:
            self.values = [ast.literal_eval(v) for v in values]
        except (ValueError, SyntaxError):
            raise ValueError(f"got {text!r}: the values must be Python literals (numbers, strings, True, None)"
                             ) from None
        self.original = getattr(self.module, self.attr)

    def set(self, value):
        if self.env is None:
            setattr(self.module, self.attr, value)
        elif value is None:
            os.environ.pop(self.env, None)
        else:
            os.environ[self.env] = value

    def restore(self):
        self.set(self.original)


def toggled(configs, toggle, rounds, steps, log, seq=0):
    """The in-process A/B of --toggle (module doc): {config: {"extra_ms": [per value], "ratio": [per later
    value, its extra over the first value's], "ratios": [per later value, the same per round]}}."""
    model, x = build(seq=seq)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    root = tempfile.mkdtemp(prefix="msprobe_host_cost_")
    values = toggle.values
    got = {c: [[] for _ in values] for c in configs}
    try:
        with harness.young_heap():
            for r in range(rounds):
                folder = os.path.join(root, f"r{r}")
                os.makedirs(folder, exist_ok=True)
                for name in configs:
                    probe = _debugger(folder, name)
                    try:
                        toggle.set(values[0])
                        for _ in range(2):
                            _step(model, x, opt, probe)
                        dumped, plain = [[] for _ in values], []
                        for _ in range(steps):
                            for i, v in enumerate(values):
                                toggle.set(v)
                                dumped[i].append(sum(_step(model, x, opt, probe)))
                            plain.append(sum(_step(model, x, opt)))
                    finally:
                        probe.close()
                    base = statistics.median(plain)
                    for i in range(len(values)):
                        got[name][i].append(statistics.median(dumped[i]) - base)
                shutil.rmtree(folder, ignore_errors=True)
                log(f"round {r + 1}/{rounds} done")
    finally:
        toggle.restore()
        os.environ.pop("MSPROBE_DEVICE_SUMMARY", None)
        shutil.rmtree(root, ignore_errors=True)
    results = {}
    for c in configs:
        extra = [statistics.median(per) for per in got[c]]
        results[c] = {"extra_ms": [1e3 * e for e in extra],
                      "ratio": [_over(e, extra[0]) for e in extra[1:]],
                      "ratios": [[_over(b, a) for a, b in zip(got[c][0], got[c][i])] for i in range(1, len(values))]}
    return results


# where --record-calls counts: msprobe._record's record by the phase of the step it runs in, and the batch reads
CALL_PARTS = (*PHASES, "batch reads")


def record_calls(configs, rounds, steps, log, device="cpu", seq=0):
    """--record-calls (module doc): {config: {part: [calls a step, µs a call]}}, parts CALL_PARTS. Each round
    gives each config a debugger of its own for two untimed steps and `steps` timed ones (the configs take
    turns, so the machine's drift falls on all of them); the sums over rounds are divided. A record that fills
    a batch counts that batch's launch too."""
    from msprobe.pytorch.summary.device import DeviceSummaries
    from msprobe.pytorch.summary.summarizer import Summarizer
    model, x = build(device=device, seq=seq)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    root = tempfile.mkdtemp(prefix="msprobe_host_cost_")
    native, launch = Summarizer.__dict__["native_record"], DeviceSummaries.launch
    clock, at, spent = time.perf_counter, [PHASES[0]], {}

    def timed_native(summarizer):  # the session takes the record function as a step starts
        record = native.fget(summarizer)
        if record is None:
            return None

        def timed(*args):  # (lean: its own cost is in the numbers)
            since = clock()
            got = record(*args)
            cell = spent[at[0]]
            cell[1] += clock() - since
            cell[0] += 1
            return got
        return timed

    def timed_launch(self, touching=None):
        since = clock()
        launch(self, touching)
        cell = spent["batch reads"]
        cell[1] += clock() - since
        cell[0] += 1

    totals = {name: {part: [0, 0.0] for part in CALL_PARTS} for name in configs}
    Summarizer.native_record, DeviceSummaries.launch = property(timed_native), timed_launch
    try:
        with harness.young_heap():
            for r in range(rounds):
                folder = os.path.join(root, f"r{r}")
                os.makedirs(folder)
                for name in configs:
                    probe = _debugger(folder, name)
                    try:
                        for i in range(steps + 2):
                            if i in (0, 2):  # (the untimed steps' calls are let go)
                                spent.update({part: [0, 0.0] for part in CALL_PARTS})
                            phases = iter(PHASES)
                            at[0] = next(phases)
                            _train(model, x, opt, probe, lambda: at.__setitem__(0, next(phases)))
                    finally:
                        probe.close()
                    for part, (n, t) in spent.items():
                        totals[name][part][0] += n
                        totals[name][part][1] += t
                shutil.rmtree(folder, ignore_errors=True)
                log(f"round {r + 1}/{rounds} done")
    finally:
        Summarizer.native_record, DeviceSummaries.launch = native, launch
        os.environ.pop("MSPROBE_DEVICE_SUMMARY", None)
        shutil.rmtree(root, ignore_errors=True)
    return {name: {part: [n / (rounds * steps), 1e6 * t / n if n else 0.0] for part, (n, t) in parts.items()}
            for name, parts in totals.items()}


def render_record_calls(results):
    shown = [part for part in CALL_PARTS if any(parts[part][0] for parts in results.values())]
    lines = ["record calls inside dumped steps (msprobe._record's record, timed around each call, by the phase "
             "it runs in) and the device path's batch reads (DeviceSummaries.launch): us a call x calls a step",
             f"{'config':<14}" + "".join(f"{part:>22}" for part in shown), "-" * (14 + 22 * len(shown))]
    for name, parts in results.items():
        cells = [f"{us:.1f} us x {n:.0f}" if n else "-" for n, us in (parts[part] for part in shown)]
        lines.append(f"{name:<14}" + "".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def _over(a, b):
    return a / b if b > 0 else float("nan")


def render_toggle(results, toggle):
    shown = [str(v) for v in toggle.values]
    lines = [f"in-process A/B of {toggle.target}: {' against '.join(shown)} (each dumped step takes one value in turn, "
             "each followed by a plain step); extra ms a step, median over rounds",
             f"{'config':<14}" + "".join(f"{v:>10}" for v in shown)
             + "".join(f"{'ratio ' + v:>16}{'rounds':>14}" for v in shown[1:]), "-" * (14 + 40 * len(shown))]
    for c, res in results.items():
        row = f"{c:<14}" + "".join(f"{e:>10.2f}" for e in res["extra_ms"])
        for ratio, per in zip(res["ratio"], res["ratios"]):
            row += f"{ratio:>15.2f}x{f'{min(per):.2f}-{max(per):.2f}':>14}"
        lines.append(row)
    lines.append("ratio: a value's extra time over the first value's; rounds: the range of the per-round ratios")
    return "\n".join(lines)


def _revision(folder):
    """The git commit `folder` is checked out at (short), or None."""
    try:
        got = subprocess.run(["git", "-C", folder, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return got.stdout.strip() if got.returncode == 0 else None


def render_comparison(ours, base, imported):
    rev = _revision(imported)
    lines = [f"us per record, median of {len(next(iter(ours.values())))} alternations "
             f"(baseline: {imported}{f', commit {rev}' if rev else ''})",
             f"{'config':<17}{'this':>9}{'baseline':>10}{'ratio':>8}   runs (this | baseline)", "-" * 79]
    for c in ours:
        if c not in base:
            continue
        a, b = statistics.median(ours[c]), statistics.median(base[c])
        lines.append(f"{c:<17}{a:>9.1f}{b:>10.1f}{a / b:>7.2f}x   "
                     + " ".join(f"{v:.0f}" for v in ours[c]) + " | " + " ".join(f"{v:.0f}" for v in base[c]))
    return "\n".join(lines)


def _header(args):
    where = f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    shape = f", input [4, {args.seq}, 32]" if args.seq else ", input [4, 32]"
    return f"torch {torch.__version__}, {args.threads} torch thread(s), device {args.device}{where}{shape}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_options(p, rounds=15, steps=5, quick=(1, 2), threads=1)  # one thread: host cost, not parallelism
    every = [*CONFIGS, *FLOORS, *RECORD_FLOORS, *DEVICE_RECORD_FLOORS, *BARE]
    p.add_argument("--configs", help=f"comma list of {', '.join(every)} "
                   "(default: all; on cuda those without _device, _floor or _records)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the model trains (default cpu)")
    p.add_argument("--baseline-src", metavar="DIR",
                   help="the src/ folder of another checkout: measure it and this one in turn, in child processes")
    p.add_argument("--cpu", action="store_true",
                   help="time steps in process CPU seconds (all threads) instead of wall seconds")
    p.add_argument("--alternations", type=int, default=3, help="with --baseline-src: pairs of runs (default 3)")
    p.add_argument("--check", action="store_true",
                   help="also measure the known case of the kernel subtraction (hooks, hooks+kernels; CPU only)")
    p.add_argument("--seq", type=int, default=0,
                   help="feed the MLP [4, SEQ, 32] (a transformer's layout: each Linear flattens it and views "
                        "its product back) instead of [4, 32]")
    p.add_argument("--toggle", metavar="TARGET=A,B",
                   help="in-process A/B of a switch read as a dump starts: MODULE.ATTR=A,B (Python literals) or "
                        "env:NAME=A,B; msprobe configs only (see the module doc)")
    p.add_argument("--record-calls", action="store_true",
                   help="instead of the timed rounds: msprobe's record calls timed inside --rounds x --steps "
                        "dumped steps of each msprobe config, by phase, and the device path's batch reads "
                        "(see the module doc)")
    p.add_argument("--no-summary-cost", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    harness.check_common_options(p, args)
    if args.seq < 0:
        p.error(f"--seq: got {args.seq}; allowed: 0 (a [4, 32] input) or a positive sequence length")
    os.environ.setdefault("MSPROBE_QUIET", "1")  # no "dumping to" line per timed debugger
    on_cuda = args.device == "cuda"
    # on cuda every config is the device path, and the floors' kernel reads host memory
    allowed = ([c for c in CONFIGS if not (on_cuda and CONFIGS[c][2])]
               + ([] if on_cuda else [*FLOORS, *RECORD_FLOORS, *DEVICE_RECORD_FLOORS]) + list(BARE))
    configs = [c.strip() for c in (args.configs or ",".join(allowed)).split(",") if c.strip()]
    bad = [c for c in configs if c not in allowed]
    if bad:
        p.error(f"--configs: unknown config {bad} for --device {args.device}; choose from {', '.join(allowed)}")
    if args.check:
        if on_cuda or args.baseline_src:
            p.error("--check: the kernel subtraction's known case runs on --device cpu, without --baseline-src")
        configs += [c for c in CHECKS if c not in configs]
    if on_cuda and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here")
    if args.cpu:
        global METRIC
        METRIC = harness.CPU
    log = harness.logger(args.quiet)
    if args.toggle:
        if args.baseline_src or args.check or on_cuda:
            p.error("--toggle: an A/B in this process on --device cpu, without --baseline-src or --check")
        others = [c for c in configs if c not in CONFIGS]
        if others:
            p.error(f"--toggle: {others} are not msprobe configs; choose from {', '.join(CONFIGS)}")
        try:
            toggle = Toggle(args.toggle)
        except ValueError as e:
            p.error(f"--toggle: {e}")
        torch.set_num_threads(args.threads)
        results = toggled(configs, toggle, args.rounds, args.steps, log, args.seq)
        harness.write_json(args.json, {"msprobe": os.path.dirname(msprobe.__file__), "toggle": args.toggle,
                                       "results": results})
        print(_header(args))
        print(render_toggle(results, toggle))
        return 0
    if args.record_calls:
        if args.baseline_src or args.check or args.toggle:
            p.error("--record-calls: in this process, without --baseline-src, --check or --toggle")
        others = [c for c in configs if c not in CONFIGS]
        if args.configs and others:
            p.error(f"--record-calls: {others} are not msprobe configs; choose from {', '.join(CONFIGS)}")
        torch.set_num_threads(args.threads)
        results = record_calls([c for c in configs if c in CONFIGS], args.rounds, args.steps, log, args.device,
                               args.seq)
        harness.write_json(args.json, {"msprobe": os.path.dirname(msprobe.__file__), "record_calls": results})
        print(_header(args))
        print(render_record_calls(results))
        return 0
    if args.baseline_src:
        src = os.path.abspath(args.baseline_src)
        if not os.path.isdir(os.path.join(src, "msprobe")):
            p.error(f"--baseline-src {args.baseline_src}: no msprobe package in it (give a checkout's src/ folder)")
        ours, base, imported = compare_with(src, configs, args.rounds, args.steps, args.threads, args.alternations,
                                            log, args.device, args.seq)
        print(_header(args))
        print(render_comparison(ours, base, imported))
        return 0
    torch.set_num_threads(args.threads)
    results = measure(configs, args.rounds, args.steps, log, args.device, args.seq)
    harness.write_json(args.json, {"msprobe": os.path.dirname(msprobe.__file__), "results": results})
    if args.no_summary_cost:
        return 0
    print(_header(args))
    print(render(results, summary_cost(300 if args.quick else 3000, args.device)))
    return 0


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    # a GPU run and an A/B keep their own sections
    heading = ("host_cost.py --device cuda" if "cuda" in sys.argv[1:]
               else "host_cost.py --baseline-src" if "--baseline-src" in sys.argv[1:]
               else "host_cost.py --toggle" if any(a.startswith("--toggle") for a in sys.argv[1:])
               else "host_cost.py --record-calls" if "--record-calls" in sys.argv[1:]
               else "host_cost.py --seq" if any(a.startswith("--seq") for a in sys.argv[1:]) else None)
    sys.exit(run_recorded("host_cost.py", main, heading))

"""How close msprobe's L0 statistics dump is to the least any module-hook dump has to do.

The issue puts the floor of a dump at "reading each captured tensor once". This script measures that
floor on the models of dump_overhead.py, in one interleaved run, beside msprobe itself:

    none      no tool
    hooks     the hooks an L0 dump needs, doing nothing: a forward hook on every submodule, a hook on
              the autograd node of each module output, a post-accumulate-grad hook on every parameter
    floor     the same hooks, each reading its tensors once with msprobe's one-pass statistics kernel
              (module outputs, the module's own parameters, the gradients of the outputs, parameter
              gradients: what an L0 record holds that no other record already read); the four numbers
              go to a list, and nothing else happens: no keys, no records, no files, no backward
              bookkeeping
    stat_L0   msprobe: PrecisionDebugger(task="statistics", level="L0"), start/stop/step

`stat_L0 - floor` is what msprobe's records cost on top of reading the data: names, filters, record
dicts, dump.json/construct.json appends, the walk that finds each module's backward. Three more
configs are stat_L0 with one part of that switched off, to show what each part costs:

    no_files  records built but not appended to dump.json and construct.json
    no_stats  every tensor record a fixed one: no statistics read, no cache lookups
    no_bwd    no backward records: no autograd walk, no node hooks, no gradient statistics
              (parameters_grad records stay)

    python benchmarks/l0_floor.py                  # 3 models, 30 rounds (about 3 minutes)
    python benchmarks/l0_floor.py --models cnn --rounds 60 --json floor.json

Each round runs one step of every config, in an order rotated each round; a config's ratio is the
median over rounds of its step time over that round's `none` step. Single steps alternate here (no
slots as in dump_overhead.py): none of these configs leaves background work to the next step.
Uses msprobe internals (the statistics kernel), unlike dump_overhead.py.
"""

import contextlib
import os
import sys
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dump_overhead import MODELS, Workload  # noqa: E402  (the same models and training step)
from floor_rounds import FloorProbe, main as floor_main, measure_probes  # noqa: E402

from msprobe.core.dump import moments  # noqa: E402
from msprobe.core.dump.writer import DumpWriter  # noqa: E402
from msprobe.pytorch import PrecisionDebugger  # noqa: E402
from msprobe.pytorch.capture.backward import BackwardTracker  # noqa: E402
from msprobe.pytorch.session import DumpSession  # noqa: E402
try:  # msprobe's split: the same threads here
    from msprobe.pytorch.summary.host import PARALLEL_MIN as _PARALLEL_MIN  # noqa: E402
except ImportError:  # host_cost.py --baseline-src: a checkout from before pytorch/summary/
    from msprobe.pytorch.statistics import _PARALLEL_MIN  # noqa: E402

CONFIGS = ("none", "hooks", "floor", "stat_L0", "no_files", "no_stats", "no_bwd")


class HookFloor(FloorProbe):
    """The hooks of an L0 dump; with `read`, each reads its tensors once with the statistics kernel."""

    def __init__(self, read):
        super().__init__(read, moments.ENABLED, "l0_floor.py")

    def _stats(self, t):
        if not self.read:
            return
        if t.dtype is torch.float32 and t.is_contiguous() and t.numel():
            n = t.numel()
            self.results.append(moments._moments(t.data_ptr(), n, moments.KINDS["float32"],
                                                 torch.get_num_threads() if n >= _PARALLEL_MIN else 1))
        else:  # not in these models' L0 records; counted, not read
            self.results.append(None)

    def start(self, model):
        for name, mod in model.named_modules():
            if name:
                self._handles.append(mod.register_forward_hook(self._forward))
        for p in model.parameters():
            self._handles.append(p.register_post_accumulate_grad_hook(lambda p: self._stats(p.grad)))

    def _forward(self, mod, args, out):
        with torch.no_grad():
            for o in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(o, torch.Tensor):
                    self._stats(o.detach())
                    if o.grad_fn is not None:
                        o.grad_fn.register_hook(self._backward)
            for p in mod._parameters.values():
                if p is not None:
                    self._stats(p.detach())

    def _backward(self, grad_inputs, grad_outputs):
        for g in grad_outputs:  # the gradients of the module's outputs; those of its inputs are the
            if g is not None:   # next module's output gradients (or the first module's input's: none)
                self._stats(g)


_FIXED_RECORD = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1], "Max": 0.0, "Min": 0.0,
                 "Mean": 0.0, "Norm": 0.0, "requires_grad": False}
# what each knock-out replaces, and with what, for the steps it runs
_KNOCK_OUTS = {
    "files": [(DumpWriter, name, lambda *a, **k: None) for name in ("add", "add_many", "add_construct",
                                                                     "add_constructs")],
    "stats": [(DumpSession, "tensor_record", lambda *a, **k: dict(_FIXED_RECORD))],
    "bwd": [(BackwardTracker, "attach", staticmethod(lambda *a, **k: None))],
}


class KnockOut:
    """msprobe's stat_L0 debugger with one part of its work (`part`: files, stats, bwd) switched off
    from start() to step(); msprobe's own methods are back in place outside that, so the other
    configs run them unwrapped."""

    def __init__(self, part, dump_path):
        self.part = part
        self.debugger = PrecisionDebugger(task="statistics", level="L0", dump_path=dump_path)
        self._patches = contextlib.ExitStack()

    def start(self, model):
        for cls, name, replacement in _KNOCK_OUTS[self.part]:
            self._patches.enter_context(mock.patch.object(cls, name, replacement))
        self.debugger.start(model)

    def stop(self):
        self.debugger.stop()

    def step(self):
        try:
            self.debugger.step()
        finally:
            self._patches.close()

    def close(self):
        self._patches.close()
        self.debugger.close()


def measure(model_name, rounds, tmp, log):
    work = Workload(model_name)
    dump_path = os.path.join(tmp, model_name)
    probes = {"none": None, "hooks": HookFloor(read=False), "floor": HookFloor(read=True),
              "stat_L0": PrecisionDebugger(task="statistics", level="L0", dump_path=dump_path),
              **{f"no_{part}": KnockOut(part, dump_path) for part in ("files", "stats", "bwd")}}

    def run_step(probe):
        if probe is not None:
            probe.start(work.model)
        work.train_step()
        if probe is not None:
            probe.stop()
            probe.step()

    return measure_probes(probes, run_step, dump_path, rounds, log, model_name)


def main(argv=None):
    floor_main(__doc__.split("\n\n")[0], MODELS, CONFIGS, measure, "L0 statistics",
               {"threads": torch.get_num_threads()}, argv)


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("l0_floor.py", main))

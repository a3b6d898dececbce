"""How close msprobe's MindSpore L0 statistics dump is to the least any Cell-hook dump has to do.

The MindSpore twin of l0_floor.py, on the models of ms_dump_overhead.py, in its synchronous process
(`pynative_synchronize` set before the first op: the strict baseline), in one interleaved run:

    none      no tool
    hooks     the hooks an L0 dump needs, doing nothing: a forward hook on every sub-Cell, a tensor
              hook on each Cell output (its gradient) and on every trainable Parameter (its gradient)
    floor     the same hooks, each reading its tensors once with msprobe's one-pass statistics kernel
              (Cell outputs, the Cell's own Parameters, the gradients of the outputs, the Parameter
              gradients: what an L0 record holds that no other record already read); the four
              numbers go to a list, and nothing else happens: no keys, no records, no files
    late      the same hooks holding their tensors, all read at stop(): msprobe too reads gradients in
              a batch after backward (and parameters at start()), and one batch of `asnumpy()` calls
              costs less than the same calls spread between the step's ops (a lower bound: a tensor
              changed in place after its hook would be read wrong)
    stat_L0   msprobe: PrecisionDebugger(task="statistics", level="L0"), start/stop/step

What the floor leaves out and an L0 record needs in MindSpore: the gradient each Cell's inputs get
through that Cell (backward `output`). MindSpore hands a tensor hook the total gradient of a tensor, so
msprobe passes each Cell input through a stand-in (a view with a tensor hook, ~9 us a use, forward and
backward) to see that Cell's share; `stat_L0 - late` counts them with names, records and files.

    python benchmarks/ms_l0_floor.py                  # 3 models, 30 rounds (about 1 minute)
    python benchmarks/ms_l0_floor.py --models transformer --rounds 60 --json floor.json

Each round runs one step of every config, in an order rotated each round; a config's ratio is the
median over rounds of its step time over that round's `none` step. Uses msprobe internals (the
statistics kernel), unlike ms_dump_overhead.py.
"""

import os
import sys

os.environ.setdefault("GLOG_v", "3")  # MindSpore's deprecation warnings: errors only
os.environ["MSPROBE_BENCH_EXECUTION"] = "synchronous"  # read by ms_dump_overhead before any op runs
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ms_dump_overhead import MODELS, Runner  # noqa: E402  (the same models and training step)
from floor_rounds import FloorProbe, main as floor_main, measure_probes  # noqa: E402

import mindspore as ms  # noqa: E402

from msprobe.core.dump import moments  # noqa: E402
from msprobe.mindspore import PrecisionDebugger  # noqa: E402
from msprobe.mindspore.statistics import host_view  # noqa: E402  (msprobe's zero-copy read)

CONFIGS = ("none", "hooks", "floor", "late", "stat_L0")


class CellHookFloor(FloorProbe):
    """The hooks of an L0 dump; with `read`, each reads its tensors once with the statistics kernel."""

    def __init__(self, read, late=False):
        super().__init__(read, moments.ENABLED, "ms_l0_floor.py")
        self.late = late  # hold the tensors, read them at stop()
        self.held = []

    def _stats(self, t):
        if not self.read:
            return
        if self.late:
            self.held.append(t)
            return
        self._read(t)

    def _read(self, t):
        a = host_view(t)
        if a.dtype.kind == "f" and a.dtype.itemsize == 4 and a.flags.c_contiguous and a.size:
            self.results.append(moments.moments(a.__array_interface__["data"][0], a.size, moments.KINDS["float32"]))
        else:  # not in these models' L0 records; counted, not read
            self.results.append(None)

    def _on_grad(self, grad):
        self._stats(grad)

    def start(self, model):
        for _, cell in model.cells_and_names():
            if cell is not model:
                self._handles.append(cell.register_forward_hook(self._forward))
        for p in model.trainable_params():
            self._handles.append(p.register_hook(self._on_grad))

    def _forward(self, cell, args, out):
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, ms.Tensor):
                self._stats(o)
                try:
                    o.register_hook(self._on_grad)
                except (RuntimeError, TypeError, ValueError):  # a tensor that takes no gradient
                    pass
        for p in cell.get_parameters(expand=False):
            self._stats(p)

    def stop(self):
        for t in self.held:
            self._read(t)
        self.held = []


def measure(model_name, rounds, tmp, log):
    runner = Runner(model_name)
    dump_path = os.path.join(tmp, model_name)
    probes = {"none": None, "hooks": CellHookFloor(read=False), "floor": CellHookFloor(read=True),
              "late": CellHookFloor(read=True, late=True),
              "stat_L0": PrecisionDebugger(task="statistics", level="L0", dump_path=dump_path)}

    return measure_probes(probes, runner.step, dump_path, rounds, log, model_name)


def main(argv=None):
    floor_main(__doc__.split("\n\n")[0], MODELS, CONFIGS, measure, "MindSpore L0 statistics, synchronous PyNative",
               {"execution": "synchronous"}, argv)


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("ms_l0_floor.py", main))

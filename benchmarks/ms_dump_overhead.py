"""Step-time overhead of msprobe's MindSpore (PyNative, CPU) dump against no tool, in one interleaved run.

Models: a mint MLP, a CNN (nn.Conv2d, pooling) and a transformer block stack, each trained with
value_and_grad + SGD. A timed step with a debugger is

    debugger.start(net); loss, grads = grad_fn(x, y); optimizer(grads); debugger.stop(); debugger.step()

so the flush at step() is part of the cost. Every config runs `--steps` steps per slot, a `none` slot
(no tool) before each config slot, the config order rotated each round; a config's ratio is the median
over rounds of (median step of its slot) / (median step of the `none` slot beside it). Pairing with
the neighbouring baseline cancels bursts of load on a shared machine. Each config slot has a debugger
of its own, closed after it: no idle Cell hook of one config is on the shared net in another's slot.

Each model is measured in two processes, one per way MindSpore can execute PyNative ops:

- synchronous: `pynative_synchronize` set before the first op. MindSpore then starts no frontend,
  backend or bprop queue threads and runs every op on the Python thread. On this 2-core machine that
  is the fastest way to train at all (transformer step ~32 ms against ~120-170 ms by default), and
  the steadiest (p10-p90 within ~10%): the strict baseline, judged against the targets.
- asynchronous: MindSpore's default. Its queue threads spin while they wait and compete with the
  kernel threads for the 2 cores, so the same step takes anywhere from ~50 to ~250 ms. Every slot
  runs its steps in several ways, interleaved, and counts the fastest: plain; with a blocking read of
  the model's output at the end of the forward pass (a forward hook on the model); and, without the
  tool, synchronously (the option on and the frontend and bprop queues bypassed: what the tool does
  while it captures, msprobe/mindspore/sync_execution.py). The baseline is the fastest way to run
  the step without the tool, not the default way (`--plain-steps`: the plain step only, as a user's
  loop runs).

Even so, the asynchronous process's ratios are not repeatable to better than about +-0.2; the
synchronous one's are good to a few hundredths.

    python benchmarks/ms_dump_overhead.py                 # 5 rounds, all models and configs
    python benchmarks/ms_dump_overhead.py --quick         # 2 rounds, 2 steps per slot
    python benchmarks/ms_dump_overhead.py --check         # exit 1 when a ratio misses its target
    python benchmarks/ms_dump_overhead.py --execution synchronous   # one of the two processes only

Only msprobe's public API is used: `from msprobe.mindspore import PrecisionDebugger`.
"""

import argparse
import contextlib
import json
import os

# MindSpore logs a deprecation warning at every set_context(pynative_synchronize=...), which the
# baseline's synchronous way calls twice a step: errors only
os.environ.setdefault("GLOG_v", "3")
import shutil
import statistics
import subprocess
import sys
import tempfile

from msprobe.mindspore import PrecisionDebugger, seed_all  # first: sets MindSpore up for numpy 2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (beside this script: timed steps, rotated rounds)

import mindspore as ms
import numpy as np
from mindspore import mint, nn

EXECUTIONS = ("synchronous", "asynchronous")
# set by the parent for the process that measures one execution; read before any op runs
_EXECUTION_ENV = "MSPROBE_BENCH_EXECUTION"
_SYNCHRONOUS_PROCESS = os.environ.get(_EXECUTION_ENV) == "synchronous"
if _SYNCHRONOUS_PROCESS:
    ms.set_context(pynative_synchronize=True)  # only takes effect before the first op
_executor = ms.common.api._pynative_executor

MODELS = ("mlp", "cnn", "transformer")
CONFIGS = ("stat_L0", "stat_L1", "stat_mix", "md5_L1", "tensor_L1")
SPECS = {"stat_L0": ("statistics", "L0", "statistics"), "stat_L1": ("statistics", "L1", "statistics"),
         "stat_mix": ("statistics", "mix", "statistics"), "md5_L1": ("statistics", "L1", "md5"),
         "tensor_L1": ("tensor", "L1", "statistics")}
# The targets: statistics L1 <= 1.5x, L0 <= 1.15x.
TARGETS = {"stat_L0": 1.15, "stat_L1": 1.5}


class MLP(nn.Cell):
    def __init__(self, d=256, hidden=512, layers=4):
        super().__init__()
        self.inp = mint.nn.Linear(d, hidden)
        self.hidden = nn.CellList([mint.nn.Linear(hidden, hidden) for _ in range(layers)])
        self.out = mint.nn.Linear(hidden, d)

    def construct(self, x):
        h = mint.nn.functional.relu(self.inp(x))
        for layer in self.hidden:
            h = mint.nn.functional.relu(layer(h)) + h
        return self.out(h)


class CNN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, pad_mode="same", has_bias=True)
        self.conv2 = nn.Conv2d(16, 32, 3, pad_mode="same", has_bias=True)
        self.conv3 = nn.Conv2d(32, 64, 3, pad_mode="same", has_bias=True)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.flat = nn.Flatten()
        self.fc = nn.Dense(64 * 4 * 4, 10)

    def construct(self, x):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        x = self.pool(self.relu(self.conv3(x)))
        return self.fc(self.flat(x))


class Block(nn.Cell):
    def __init__(self, d=128, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm((d,))
        self.qkv = mint.nn.Linear(d, 3 * d)
        self.proj = mint.nn.Linear(d, d)
        self.ln2 = nn.LayerNorm((d,))
        self.fc1 = mint.nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.fc2 = mint.nn.Linear(4 * d, d)

    def construct(self, x):
        b, s, d = x.shape
        h = self.heads
        q, k, v = mint.chunk(self.qkv(self.ln1(x)), 3, -1)
        q = q.reshape(b, s, h, d // h).transpose(0, 2, 1, 3)
        k = k.reshape(b, s, h, d // h).transpose(0, 2, 1, 3)
        v = v.reshape(b, s, h, d // h).transpose(0, 2, 1, 3)
        att = mint.softmax(mint.matmul(q, k.transpose(0, 1, 3, 2)) * (d // h) ** -0.5, dim=-1)
        y = mint.matmul(att, v).transpose(0, 2, 1, 3).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class Transformer(nn.Cell):
    def __init__(self, d=128, blocks=2):
        super().__init__()
        self.blocks = nn.CellList([Block(d) for _ in range(blocks)])
        self.head = mint.nn.Linear(d, 16)

    def construct(self, x):
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def make(name):
    seed_all(0)
    rng = np.random.default_rng(0)
    if name == "mlp":
        return MLP(), rng.standard_normal((64, 256)), rng.standard_normal((64, 256))
    if name == "cnn":
        return CNN(), rng.standard_normal((8, 3, 32, 32)), rng.standard_normal((8, 10))
    return Transformer(), rng.standard_normal((4, 32, 128)), rng.standard_normal((4, 32, 16))


class Runner:
    def __init__(self, name):
        self.net, x, y = make(name)
        self.x, self.y = ms.Tensor(x.astype(np.float32)), ms.Tensor(y.astype(np.float32))
        self.opt = nn.SGD(self.net.trainable_params(), learning_rate=1e-4)
        net = self.net
        self.sync_forward = False
        # registered for every step, tool or not, so that all of them take the same Cell call path
        self._hook = net.register_forward_hook(self._read_output)

        def loss_fn(xb, yb):
            return mint.mean((net(xb) - yb) ** 2)
        self.grad_fn = ms.value_and_grad(loss_fn, None, self.opt.parameters)

    def _read_output(self, cell, args, output):
        if self.sync_forward:
            output.asnumpy()  # a blocking wait for the forward pass (see the module docstring)

    def step(self, debugger=None):
        if debugger is not None:
            debugger.start(self.net)
        loss, grads = self.grad_fn(self.x, self.y)
        self.opt(grads)
        if debugger is not None:
            debugger.stop()
            debugger.step()
        return float(loss.asnumpy())  # waits for the step to finish


def timed_step(runner, debugger=None):
    return harness.timed(runner.step, debugger)


def _synchronous(on):
    """What the tool does while it captures (msprobe/mindspore/sync_execution.py), for a baseline step."""
    ms.set_context(pynative_synchronize=on)
    if on:
        _executor.disable_frontend_and_bprop_pipeline()
    else:
        _executor.enable_frontend_and_bprop_pipeline()


def slot(runner, steps, debugger=None, plain_only=False):
    """(median wall time, median process CPU time, which way was the fastest) of `steps` steps run each
    way, interleaved step by step (see the module docstring). CPU time counts every thread of the
    process and not the time spent waiting for a core, so it is steadier on a loaded machine."""
    ways = {"plain": []}
    # A synchronous process has one way, and keeps its setting: switching it off after a step would
    # leave the rest of the run asynchronous (each later slot measuring a mix of ways).
    if not plain_only and not _SYNCHRONOUS_PROCESS:
        ways["blocking read"] = []
        if debugger is None:  # the tool runs synchronously while it captures: nothing to add there
            ways["synchronous"] = []
    for _ in range(steps):
        for way, times in ways.items():
            runner.sync_forward = way == "blocking read"
            if way == "synchronous":
                _synchronous(True)
            try:
                times.append(timed_step(runner, debugger))
            finally:
                runner.sync_forward = False
                if way == "synchronous":
                    _synchronous(False)
    medians = {w: (statistics.median(t for t, _ in v), statistics.median(c for _, c in v)) for w, v in ways.items()}
    best = min(medians, key=lambda w: medians[w][0])
    return medians[best][0], medians[best][1], best


def measure(models, configs, rounds, steps, root, log, plain_only=False):
    results = {}
    for name in models:
        runner = Runner(name)
        for read in (False, True, False):  # warm-up: kernels built
            runner.sync_forward = read
            runner.step()
        cfg_paths = {}
        for c in configs:
            task, level, summary = SPECS[c]
            cfg_paths[c] = os.path.join(root, f"{name}_{c}.json")
            with open(cfg_paths[c], "w") as f:
                json.dump({"task": task, "level": level, "dump_path": os.path.join(root, name, c),
                           task: {"summary_mode": summary} if task == "statistics" else {}}, f)
            with _debugger(cfg_paths[c]) as debugger:
                slot(runner, 1, debugger, plain_only)  # warm-up of the tool's own paths
            shutil.rmtree(os.path.join(root, name, c), ignore_errors=True)  # (each debugger a new dump)
        ratios = {c: [] for c in configs}
        cpu_ratios = {c: [] for c in configs}
        base, base_cpu = [], []
        fastest = {"without": {}, "with": {}}
        for r in range(rounds):
            for c in harness.rotated(configs, r):
                b, bc, base_way = slot(runner, steps, None, plain_only)
                # a debugger of its own, closed after its slot: an L0 or mix debugger keeps its Cell hooks
                # between the steps it dumps, and idle on the shared net they would slow every other slot
                with _debugger(cfg_paths[c]) as debugger:
                    runner.step(debugger)  # (untimed: its first step installs the hooks)
                    t, tc, tool_way = slot(runner, steps, debugger, plain_only)
                base.append(b)
                base_cpu.append(bc)
                for side, way in (("without", base_way), ("with", tool_way)):
                    fastest[side][way] = fastest[side].get(way, 0) + 1
                ratios[c].append(t / b)
                cpu_ratios[c].append(tc / bc)
                # outside the timed slots: wait for the file system to finish the delete too, else its
                # journal work (tensor_L1 frees hundreds of MB) lands in the next slots' steps
                shutil.rmtree(os.path.join(root, name, c), ignore_errors=True)
                os.sync()
            log(f"{name}: round {r + 1}/{rounds} done")
        log(f"{name}: fastest way of the {len(base)} slots without the tool: "
            + ", ".join(f"{w} {n}" for w, n in fastest["without"].items())
            + "; with it: " + ", ".join(f"{w} {n}" for w, n in fastest["with"].items()))
        results[name] = {"base_ms": statistics.median(base) * 1e3,
                         **{c: statistics.median(v) for c, v in ratios.items()}}
        results[name + " (cpu)"] = {"base_ms": statistics.median(base_cpu) * 1e3,
                                    **{c: statistics.median(v) for c, v in cpu_ratios.items()}}
    return results


@contextlib.contextmanager
def _debugger(cfg_path):
    debugger = PrecisionDebugger(config_path=cfg_path)
    try:
        yield debugger
    finally:
        debugger.close()


def render(results, configs, execution):
    lines = [f"{execution} process: ratios of step time with the tool to step time without (median over "
             "rounds); '(cpu)' rows: process CPU time instead of wall time.",
             "| model | step (no tool) | " + " | ".join(configs) + " |",
             "|---|---|" + "---|" * len(configs)]
    for name, res in results.items():
        cells = [f"{res[c]:.2f}x" for c in configs]
        lines.append(f"| {name} | {res['base_ms']:.1f} ms | " + " | ".join(cells) + " |")
    lines.append("targets: " + ", ".join(f"{c} <= {t}x" for c, t in TARGETS.items()))
    return "\n".join(lines)


def measure_in_process(execution, args):
    """Run this script for one execution in a fresh process (MindSpore's execution is fixed by then);
    its results come back as JSON on the last line of its output."""
    cmd = [sys.executable, os.path.abspath(__file__), "--models", args.models, "--configs", args.configs,
           "--rounds", str(args.rounds), "--steps", str(args.steps), "--one-execution"]
    if args.plain_steps:
        cmd.append("--plain-steps")
    if args.quiet:
        cmd.append("--quiet")
    env = dict(os.environ, **{_EXECUTION_ENV: execution})
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {execution} process failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--configs", default=",".join(CONFIGS))
    harness.add_common_options(p, rounds=5, steps=3, quick=(2, 2), threads=False)
    p.add_argument("--check", action="store_true")
    p.add_argument("--execution", default="both", choices=EXECUTIONS + ("both",),
                   help="which process(es) to measure (see the module docstring)")
    p.add_argument("--plain-steps", action="store_true",
                   help="time the plain step only (not the faster of it and the step with a blocking forward read)")
    p.add_argument("--one-execution", action="store_true", help=argparse.SUPPRESS)  # a child process: JSON out
    args = p.parse_args(argv)
    harness.check_common_options(p, args)
    log = harness.logger(args.quiet)
    models = [m for m in args.models.split(",") if m]
    configs = [c for c in args.configs.split(",") if c]
    for m in models:
        if m not in MODELS:
            p.error(f"--models: got {m!r}; allowed: {', '.join(MODELS)}")
    for c in configs:
        if c not in CONFIGS:
            p.error(f"--configs: got {c!r}; allowed: {', '.join(CONFIGS)}")
    if args.one_execution:  # this is the process of one execution
        root = tempfile.mkdtemp(prefix="ms_dump_bench_")
        try:
            results = measure(models, configs, args.rounds, args.steps, root, log, args.plain_steps)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(json.dumps(results))
        return 0
    executions = EXECUTIONS if args.execution == "both" else (args.execution,)
    missed, numbers = [], {}
    for execution in executions:
        log(f"-- {execution} process")
        results = numbers[execution] = measure_in_process(execution, args)
        print(render(results, configs, execution), flush=True)
        missed += [(execution, m, c) for m in results if not m.endswith("(cpu)")
                   for c, t in TARGETS.items() if c in results[m] and results[m][c] > t]
    harness.write_json(args.json, numbers)
    if args.check and missed:
        print("missed targets: " + ", ".join(f"{e}/{m}/{c}" for e, m, c in missed))
        return 1
    return 0


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("ms_dump_overhead.py", main))

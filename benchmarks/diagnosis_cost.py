"""What the diagnosis adds to `msprobe compare`: time of diagnose() relative to compare_dumps() on the
same pair of dumps, measured in one run, taking turns, medians over rounds.

The dumps are the README demo's transformer (examples/demo.py) with more blocks: one fp32 run and one
with block 1's softmax in bfloat16, one training step each, in statistics and in tensor mode (level
mix). Each row also says whether the diagnosis named the planted softmax first.

    python benchmarks/diagnosis_cost.py                 # blocks 2 and 8, 5 rounds
    python benchmarks/diagnosis_cost.py --blocks 2 --rounds 3
    python benchmarks/diagnosis_cost.py --against main  # CPU time, this tree over git's main

With --against REV the same dumps are read into rows and diagnosed by this tree and by REV's src/ (a fresh
interpreter each, taking turns), in CPU seconds (time.process_time: other work on a shared machine does
not count): `rows_from_records` and `frame_from_records` (both dumps' records into the typed rows the
diagnosis reads, repeated READ_REPEATS times a sample) and diagnose().
"""

import argparse
import gc
import glob
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from msprobe.core.diagnosis import diagnose
from msprobe.core.compare.engine import compare_dumps
from msprobe.pytorch import PrecisionDebugger, seed_all

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (beside this script: the rounds' options)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("rows_from_records", "frame_from_records", "diagnose")
READ_REPEATS = 20  # a demo dump reads in milliseconds: a sample reads it this many times
SAMPLES = 5  # per interpreter and stage: CPU time on a shared machine still varies by half between samples


def _demo():
    spec = importlib.util.spec_from_file_location("msprobe_demo", os.path.join(ROOT, "examples", "demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dump(demo, path, planted, blocks, task):
    seed_all(1234)
    model = demo.demo_model(layers=blocks, planted=planted)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens = torch.randint(0, 256, (4, 32))
    debugger = PrecisionDebugger(dump_path=path, task=task, level="mix")
    debugger.start(model, rank_id=0)
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).backward()
    opt.step()
    debugger.stop()
    debugger.step()
    debugger.close()


def measure(target, golden, rounds):
    compare_s, diagnose_s, d, rows = [], [], None, 0
    for _ in range(rounds):  # taking turns: both see the same machine load
        t0 = time.perf_counter()
        results = compare_dumps(target, golden, progress=False, workers=1)
        t1 = time.perf_counter()
        d = diagnose(results)
        t2 = time.perf_counter()
        compare_s.append(t1 - t0)
        diagnose_s.append(t2 - t1)
        rows = sum(len(r.table) for r in results)
    return statistics.median(compare_s), statistics.median(diagnose_s), d, rows


def stage_cpu(target, golden, rounds):
    """stage -> CPU seconds of each of `rounds` samples, by the msprobe this interpreter imports: both
    dumps' records into rows (`READ_REPEATS` times a sample, the cyclic collector paused as the engine
    pauses it), and a diagnosis of their compare (with diagnosis.json's content)."""
    from msprobe.core.compare import rows
    datas = []
    for path in sorted(glob.glob(os.path.join(target, "**", "dump.json"), recursive=True)
                       + glob.glob(os.path.join(golden, "**", "dump.json"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            datas.append(json.load(f)["data"])
    results = compare_dumps(target, golden, progress=False, workers=1)
    out = {s: [] for s in STAGES}
    for _ in range(rounds):
        for name in STAGES[:2]:
            read = getattr(rows, name)
            gc.collect()
            gc.disable()  # as the compare engine reads a dump (CollectorPause)
            t0 = time.process_time()
            for _ in range(READ_REPEATS):
                for data in datas:
                    read(data)
            out[name].append(time.process_time() - t0)
            gc.enable()
        t0 = time.process_time()
        d = diagnose(results)
        if hasattr(d, "to_json"):  # a typed Diagnosis: diagnosis.json's content is made when written
            d.to_json()
        out["diagnose"].append(time.process_time() - t0)
    return out


def against(rev, blocks, rounds, log):
    """Median CPU seconds of each stage by this tree and by git revision `rev`, and their ratio."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "src"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        for so in (f for f in os.listdir(os.path.join(ROOT, "src", "msprobe")) if f.endswith(".so")):
            with open(os.path.join(ROOT, "src", "msprobe", so), "rb") as a, \
                    open(os.path.join(tmp, "src", "msprobe", so), "wb") as b:
                b.write(a.read())
        demo = _demo()
        numbers = []
        print(f"{'blocks':>6} {'mode':10s} {'stage':18s} {rev + ' cpu s':>12} {'this cpu s':>11} "
              f"{'this/' + rev:>10} {'of minima':>10}")
        for n in blocks:
            for task in ("statistics", "tensor"):
                golden, target = os.path.join(tmp, f"{n}_{task}_fp32"), os.path.join(tmp, f"{n}_{task}_bf16")
                dump(demo, golden, False, n, task)
                dump(demo, target, True, n, task)
                times = {(side, s): [] for side in ("ref", "this") for s in STAGES}
                for r in range(rounds):  # taking turns, a fresh interpreter each
                    log(f"{n} blocks, {task}: round {r + 1}/{rounds}")
                    for side, src in (("ref", os.path.join(tmp, "src")), ("this", os.path.join(ROOT, "src"))):
                        out = subprocess.run([sys.executable, __file__, "--cpu-of", target, golden],
                                             env=dict(os.environ, PYTHONPATH=src), check=True, capture_output=True,
                                             text=True).stdout
                        for stage, samples in json.loads(out).items():
                            times[side, stage] += samples
                for stage in STAGES:  # medians, and the ratio of the fastest samples (others' load only adds)
                    ref, this = statistics.median(times["ref", stage]), statistics.median(times["this", stage])
                    fastest = min(times["this", stage]) / min(times["ref", stage])
                    print(f"{n:>6} {task:10s} {stage:18s} {ref:>12.4f} {this:>11.4f} {this / ref:>10.3f} "
                          f"{fastest:>10.3f}", flush=True)
                    numbers.append({"blocks": n, "mode": task, "stage": stage, "ref_cpu_s": ref,
                                    "this_cpu_s": this, "ratio": this / ref, "ratio_of_minima": fastest})
    return numbers


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, nargs="+", default=[2, 8], help="transformer blocks")
    parser.add_argument("--against", metavar="REV", help="git revision to compare diagnose()'s CPU time with")
    parser.add_argument("--cpu-of", nargs=2, metavar=("TARGET", "GOLDEN"), help=argparse.SUPPRESS)
    harness.add_common_options(parser, rounds=5, quick=(1,))
    args = parser.parse_args()
    harness.check_common_options(parser, args)
    log = harness.logger(args.quiet)
    if args.cpu_of:  # one side of --against: this interpreter's msprobe
        print(json.dumps(stage_cpu(*args.cpu_of, SAMPLES)))
        return 0
    if args.against:
        harness.write_json(args.json, against(args.against, args.blocks, args.rounds, log))
        return 0
    demo = _demo()
    numbers = []
    print(f"{'blocks':>6} {'mode':10s} {'rows':>6} {'compare s':>10} {'diagnose s':>11} {'diag/compare':>13}  "
          f"named first")
    with tempfile.TemporaryDirectory() as tmp:
        for blocks in args.blocks:
            for task in ("statistics", "tensor"):
                golden = os.path.join(tmp, f"{blocks}_{task}_fp32")
                target = os.path.join(tmp, f"{blocks}_{task}_bf16")
                dump(demo, golden, False, blocks, task)
                dump(demo, target, True, blocks, task)
                log(f"{blocks} blocks, {task}: {args.rounds} rounds")
                c, dg, d, rows = measure(target, golden, args.rounds)
                top = d.suspects[0].api if d.suspects else "-"
                print(f"{blocks:>6} {task:10s} {rows:>6} {c:>10.3f} {dg:>11.3f} {dg / c:>13.3f}  {top}", flush=True)
                numbers.append({"blocks": blocks, "mode": task, "rows": rows, "compare_s": c, "diagnose_s": dg,
                                "named_first": top})
    harness.write_json(args.json, numbers)
    return 0


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    against_rev = any(a.startswith("--against") for a in sys.argv[1:])  # its own section beside the default run's
    sys.exit(run_recorded("diagnosis_cost.py", main, heading="diagnosis_cost.py --against" if against_rev else None))

"""Compare and diagnose a synthetic many-rank statistics dump: RANKS ranks x STEPS steps of CALLS calls
each (two inputs and one output a call, an all_reduce in the middle of every step), a target and a
golden. In the target, one rank's values drift from one call of step 1 on (a rank-local bug), and the
other ranks receive it through the all_reduce. Prints the time `msprobe compare` takes to compare,
diagnose and write the results (in a fresh process), its peak resident memory and its workers', and what
the diagnosis named; a progress bar runs over the rank pairs.

    python benchmarks/multirank_compare.py [--ranks 64] [--steps 3] [--calls 1500] [--record]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import orjson

PLANT_RANK, PLANT_STEP = 5, 1  # (the last rank with fewer ranks)
TARGET_S = 60


def _tensor(value, n):
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [n], "Max": value, "Min": -value,
            "Mean": value / 10, "Norm": value * 3, "requires_grad": True}


def rank_data(rank, step, calls, planted, plant_rank):
    """One rank's dump.json data: calls linear/relu/add by turns; the planted rank's outputs drift from the
    first third on, everyone's after the all_reduce in the middle."""
    data, counts = {}, {}
    drift = 1.0
    for i in range(calls):
        if planted and step == PLANT_STEP and rank == plant_rank and i == calls // 3:
            drift = 1.01
        name = ("Functional.linear", "Functional.relu", "Tensor.__add__")[i % 3]
        if i == calls // 2:
            name = "Distributed.all_reduce"
            if planted and step == PLANT_STEP:
                drift = max(drift, 1.001)
        index = counts.get(name, 0)
        counts[name] = index + 1
        x = 1.0 + (i % 97) / 97 + step
        data[f"{name}.{index}.forward"] = {"input_args": [_tensor(x, 64), _tensor(x / 2, 64)], "input_kwargs": {},
                                           "output": [_tensor((x + 0.5) * drift, 64)]}
    return data


def write_dumps(root, ranks, steps, calls, planted):
    for step in range(steps):
        for rank in range(ranks):
            d = os.path.join(root, f"step{step}", f"rank{rank}")
            os.makedirs(d)
            doc = {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                   "data": rank_data(rank, step, calls, planted, min(PLANT_RANK, ranks - 1))}
            with open(os.path.join(d, "dump.json"), "wb") as f:
                f.write(orjson.dumps(doc))


_CHILD = """
import json, resource, sys, time
from msprobe.core.compare import write_compare
t0 = time.perf_counter()
out = write_compare(sys.argv[1], sys.argv[2], sys.argv[3], keep_tables=False, progress=True)
t1 = time.perf_counter()
d = out.diagnosis
top = d["suspects"][0] if d["suspects"] else {}
print(json.dumps({"total_s": t1 - t0, "pairs": len(out.results), "rows": sum(r.row_count for r in out.results),
                  "api": top.get("api"), "ranks": top.get("ranks"),
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1500, help="calls per rank and step")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        for side, planted in (("golden", False), ("target", True)):
            write_dumps(os.path.join(tmp, side), args.ranks, args.steps, args.calls, planted)
        made = time.perf_counter() - t0
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(tmp) for f in fs) / 2 ** 20
        done = subprocess.run([sys.executable, "-c", _CHILD, os.path.join(tmp, "target"), os.path.join(tmp, "golden"),
                               os.path.join(tmp, "out")], stdout=subprocess.PIPE, text=True, check=True)
    r = orjson.loads(done.stdout.strip().splitlines()[-1])
    print(f"{args.ranks} ranks x {args.steps} steps x {args.calls} calls: {r['pairs']} rank pairs, {r['rows']} "
          f"target rows, {size:.0f} MB of dump.json both sides (made in {made:.1f} s)")
    print(f"{'total s':>8} {'target s':>9} {'peak RSS MB':>12} {'worker peak MB':>15}  named first")
    print(f"{r['total_s']:>8.1f} {TARGET_S:>9} {r['peak_mb']:>12.0f} {r['worker_peak_mb']:>15.0f}  "
          f"{r['api']} on rank(s) {r['ranks']}")
    print("total: compare, diagnose and write every result file and diagnosis.json (write_compare, as "
          "`msprobe compare` runs it); peak RSS: the compare process, and the largest of its workers")
    plant_rank = min(PLANT_RANK, args.ranks - 1)
    if r["ranks"] != [plant_rank]:
        print(f"unexpected diagnosis: wanted rank {plant_rank}")
        return 1
    return 0


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("multirank_compare.py", main))

"""Speed of `msprobe compare`, each number next to a baseline measured in the same run.

1. Real-data (tensor) compare of a generated fp32-vs-bf16 dump pair in the layout of an L1 tensor
   dump (dump.json + dump_tensor_data/*.npy; bf16 stored as float32 like our dumper does), with 1 and
   2 worker processes, interleaved, medians. Throughput = bytes of both sides / wall time. Baseline:
   reading the same bytes (np.load mmap + sum). Peak memory = max RSS of the compare process and of
   its largest worker. Also the CPU throughput of one worker (metrics only, one core).
2. Statistics compare of two dump.json files with N tensor records, and the diagnosis that follows it.
   Baseline: json.load of both.
3. `msprobe compare -h` start-up against `python -c pass`.
4. With `--engine ray`, only this: the rank pairs of a many-rank compare on the process pool and on Ray,
   in one run: a synthetic L1 statistics dump of --pairs ranks (about --pair-records records a rank) and
   a tensor dump of --tensor-pairs ranks. Wall time and the driver's peak RSS of `write_compare` (a fresh
   process each), and whether the two engines wrote the same files. Ray runs on a local cluster started
   here with `ray start --head` (its start-up is printed, not counted: a user's cluster is up already).

    python benchmarks/compare_throughput.py                  # 0.2 GB, 100k records, 3 rounds
    python benchmarks/compare_throughput.py --quick          # CI smoke: 1 round, 0.05 GB, 10k records
    python benchmarks/compare_throughput.py --tensor-gb 3 --records 1000000 --dir /tmp/cmpbench
    python benchmarks/compare_throughput.py --engine ray --pairs 1024 --tensor-pairs 64 --record

Generated files go under --dir (default: a temporary folder, removed afterwards); keep them out of
the repository. The machine may be shared: read the ratios, and the CPU-time columns.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (beside this script: the rounds' options and medians)

TENSOR_ELEMENTS = 1 << 22  # 16 MiB per float32 tensor file


def gen_tensor_pair(root, total_gb):
    """Two rank dirs (target bf16, golden fp32) holding about `total_gb` GB of .npy files together."""
    n_files = max(2, int(total_gb * 1e9 / 2 / (TENSOR_ELEMENTS * 4)))
    rng = np.random.default_rng(0)
    base = rng.standard_normal(TENSOR_ELEMENTS).astype(np.float32)
    sides = {}
    for side in ("target", "golden"):
        rank = os.path.join(root, side, "step0", "rank0")
        os.makedirs(os.path.join(rank, "dump_tensor_data"), exist_ok=True)
        sides[side] = rank
    data_t, data_g = {}, {}
    for i in range(n_files // 2):  # one forward record per pair of files: input.0 and output.0
        key = f"Functional.linear.{i}.forward"
        rec_t, rec_g = {"input_args": [], "input_kwargs": {}, "output": []}, \
            {"input_args": [], "input_kwargs": {}, "output": []}
        for role, slot in (("input", "input_args"), ("output", "output")):
            golden = np.roll(base, i * 7 + len(role)) * (1 + i % 5)
            target = (golden.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)  # bf16 truncation
            name = f"{key}.{role}.0.npy"
            np.save(os.path.join(sides["golden"], "dump_tensor_data", name), golden)
            np.save(os.path.join(sides["target"], "dump_tensor_data", name), target)
            for rec, arr, dtype in ((rec_g, golden, "torch.float32"), (rec_t, target, "torch.bfloat16")):
                rec[slot].append({"type": "torch.Tensor", "dtype": dtype, "shape": [TENSOR_ELEMENTS],
                                  "Max": float(arr.max()), "Min": float(arr.min()), "Mean": float(arr.mean()),
                                  "Norm": float(np.linalg.norm(arr)), "requires_grad": True, "data_name": name})
        data_t[key], data_g[key] = rec_t, rec_g
    for side, data in (("target", data_t), ("golden", data_g)):
        with open(os.path.join(sides[side], "dump.json"), "w") as f:
            json.dump({"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                       "data": data}, f)
    nbytes = sum(os.path.getsize(os.path.join(r, "dump_tensor_data", n))
                 for r in sides.values() for n in os.listdir(os.path.join(r, "dump_tensor_data")))
    return sides["target"], sides["golden"], nbytes


def gen_stats_pair(root, n_tensors):
    """Two statistics dump.json files with `n_tensors` tensor records (3 per call), 1% apart."""
    rng = np.random.default_rng(1)
    paths = []
    for side, scale in (("target", 1.01), ("golden", 1.0)):
        rank = os.path.join(root, "stats_" + side, "step0", "rank0")
        os.makedirs(rank, exist_ok=True)
        vals = rng.random(n_tensors)
        with open(os.path.join(rank, "dump.json"), "w") as f:
            f.write('{"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": null, "data": {')
            for i in range(0, n_tensors, 3):
                ts = [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4, 64, 256],
                       "Max": float(v * scale), "Min": float(-v), "Mean": float(v / 100), "Norm": float(v * 30),
                       "requires_grad": True} for v in vals[i:i + 3]]
                rec = {"input_args": ts[:2], "input_kwargs": {}, "output": ts[2:]}
                f.write((", " if i else "") + json.dumps(f"Functional.linear.{i // 3}.forward") + ": " + json.dumps(rec))
            f.write("}}")
        paths.append(rank)
    return paths


_CHILD = r"""
import json, resource, sys, time
from msprobe.core.compare.engine import compare_dumps
from msprobe.core.compare.writer import write_result
try:
    from msprobe.core.diagnosis import diagnose
except ImportError:  # --baseline-src of a checkout from before core/diagnosis/
    from msprobe.core.compare.diagnosis import diagnose
t, g, workers, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
w, c = time.perf_counter(), time.process_time()
(r,) = compare_dumps(t, g, workers=workers, progress=False, stack=False)
compare_wall, compare_cpu = time.perf_counter() - w, time.process_time() - c
w = time.perf_counter()
if out != "-":
    write_result(r.table, out, "bench.csv")  # before the diagnosis adds its column: msProbe's columns only
write_wall = time.perf_counter() - w
w = time.perf_counter()
diagnose([r])
print(json.dumps({"wall": compare_wall, "cpu": compare_cpu, "write": write_wall,
                  "diagnose": time.perf_counter() - w,
                  "phases": getattr(r, "seconds", {}),
                  "rows": len(r.table), "children_cpu": resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
                  + resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "child_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""

_READ = r"""
import os, sys, time, numpy as np
root = sys.argv[1]
w = time.perf_counter()
s = 0.0
for side in ("target", "golden"):
    d = os.path.join(root, side, "step0", "rank0", "dump_tensor_data")
    for n in sorted(os.listdir(d)):
        a = np.load(os.path.join(d, n), mmap_mode="r")
        for i in range(0, a.size, 1 << 20):
            s += float(a[i:i + (1 << 20)].sum(dtype=np.float64))
print(time.perf_counter() - w)
"""


COLD = False  # --cold: evict the tensor files from the page cache before every run


def evict(root):
    """Drop `root`'s files from the page cache (posix_fadvise on these files only: nothing else's cache
    is touched), so the next run reads them from disk."""
    for d, _, files in os.walk(root):
        for n in files:
            fd = os.open(os.path.join(d, n), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


BASELINE_SRC = None  # --baseline-src: another checkout's src/ whose compare runs interleaved with ours


def run_child(t, g, workers, out="-", baseline=False):
    env = dict(os.environ, PYTHONPATH=BASELINE_SRC) if baseline else None
    proc = subprocess.run([sys.executable, "-c", _CHILD, t, g, str(workers), out], capture_output=True, text=True,
                          check=True, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tensor_bench(root, gb, rounds):
    t, g, nbytes = gen_tensor_pair(root, gb)
    print(f"\n[tensor] {nbytes / 1e9:.2f} GB in {len(os.listdir(os.path.join(t, 'dump_tensor_data'))) * 2} "
          f"files; {rounds} interleaved rounds, medians")
    variants = [(w, False) for w in (1, 2)] + ([(w, True) for w in (1, 2)] if BASELINE_SRC else [])
    names = {v: f"{'old ' if v[1] else ''}compare, {v[0]} worker" + ("s" if v[0] > 1 else "") for v in variants}
    rows = {"read (baseline)": [], **{n: [] for n in names.values()}}
    extra = {n: [] for n in names.values()}
    for _ in range(rounds):
        if COLD:
            evict(root)
        out = subprocess.run([sys.executable, "-c", _READ, root], capture_output=True, text=True, check=True)
        rows["read (baseline)"].append(float(out.stdout.strip()))
        for workers, old in variants:
            if COLD:
                evict(root)
            r = run_child(t, g, workers, baseline=old)
            rows[names[workers, old]].append(r["wall"])
            extra[names[workers, old]].append(r)
    base = harness.median(rows["read (baseline)"])
    print(f"{'':22s}{'wall s':>9s}{'GB/s':>8s}{'x read':>8s}{'cpu s':>9s}{'peak MB main/worker':>22s}")
    numbers = {"bytes": nbytes}
    for name, walls in rows.items():
        w = harness.median(walls)
        numbers[name] = {"wall_s": w, "gb_per_s": nbytes / 1e9 / w, "x_read": w / base}
        line = f"{name:22s}{w:9.2f}{nbytes / 1e9 / w:8.2f}{w / base:8.2f}"
        if name in extra:
            e = extra[name]
            cpu = harness.median(x["cpu"] + x["children_cpu"] for x in e)
            line += f"{cpu:9.2f}{max(x['rss_mb'] for x in e):11.0f} /{max(x['child_rss_mb'] for x in e):7.0f}"
        print(line)
    # one worker's own speed: metrics of one pair of memory-mapped files on one core (CPU time)
    from msprobe.core.compare.metrics import tensor_metrics
    name = sorted(os.listdir(os.path.join(t, "dump_tensor_data")))[0]
    a = np.load(os.path.join(t, "dump_tensor_data", name), mmap_mode="r")
    b = np.load(os.path.join(g, "dump_tensor_data", name), mmap_mode="r")
    cpu = []
    for _ in range(max(3, rounds)):
        c = time.process_time()
        tensor_metrics(a, b)
        cpu.append(time.process_time() - c)
    c = harness.median(cpu)
    print(f"single core, metrics only: {(a.nbytes + b.nbytes) / 1e9 / c:.2f} GB/s of CPU time "
          f"({(a.nbytes + b.nbytes) / 1e6:.0f} MB pair in {c * 1000:.0f} ms)")
    numbers["single_core_cpu_gb_per_s"] = (a.nbytes + b.nbytes) / 1e9 / c
    return numbers


def stats_bench(root, n, rounds):
    t, g = gen_stats_pair(root, n)
    size = sum(os.path.getsize(os.path.join(p, "dump.json")) for p in (t, g))
    print(f"\n[statistics] {n} tensor records per side, {size / 1e6:.0f} MB of dump.json; {rounds} rounds, medians")
    parse, runs, old = [], [], []
    for _ in range(rounds):
        w = time.perf_counter()
        for p in (t, g):
            with open(os.path.join(p, "dump.json")) as f:
                json.load(f)
        parse.append(time.perf_counter() - w)
        runs.append(run_child(t, g, 1, os.path.join(root, "stats_out")))
        if BASELINE_SRC:
            old.append(run_child(t, g, 1, os.path.join(root, "stats_out_old"), baseline=True))
    med = harness.median
    p = med(parse)
    print(f"json.load of both (baseline) {p:7.2f} s   (load average {os.getloadavg()[0]:.1f})")
    numbers = {"records": n, "json_load_s": p}
    for label, rs in (("", runs), ("old ", old)):
        if not rs:
            continue
        c, wr = med(r["wall"] for r in rs), med(r["write"] for r in rs)
        ph = [r["phases"] for r in rs if r["phases"]]
        if ph:
            read, match, table = (med(x.get(k, 0.0) for x in ph) for k in ("read", "match", "table"))
            print(f"{label + 'compare_dumps':28s} {c:7.2f} s  = read {read:.2f} + match {match:.2f} + table {table:.2f} "
                  f"(+ {c - read - match - table:.2f} other)")
        else:
            print(f"{label + 'compare_dumps':28s} {c:7.2f} s")
        print(f"{label + 'csv of %d rows' % n:28s} {wr:7.2f} s")
        print(f"{label + 'diagnose':28s} {med(r['diagnose'] for r in rs):7.2f} s  (msprobe compare runs it too)")
        numbers[label + "compare"] = {"compare_s": c, "csv_s": wr, "diagnose_s": med(r["diagnose"] for r in rs),
                                      "x_json_load": (c + wr) / p}
        print(f"{label + 'total':28s} {c + wr:7.2f} s  ({(c + wr) / p:.2f}x the baseline; CPU of compare "
              f"{med(r['cpu'] + r['children_cpu'] for r in rs):.2f} s in all processes; peak RSS "
              f"{max(r['rss_mb'] for r in rs):.0f} MB main, {max(r['child_rss_mb'] for r in rs):.0f} MB largest child)")
    if old:
        new_total = med(r["wall"] + r["write"] for r in runs)
        old_total = med(r["wall"] + r["write"] for r in old)
        print(f"compare + csv, new/old       {new_total / old_total:.2f}")
        same = _same_file(os.path.join(root, "stats_out", "bench.csv"), os.path.join(root, "stats_out_old", "bench.csv"))
        print(f"csv byte-identical to the old one: {same}")
    return numbers


def _same_file(a, b):
    import filecmp
    return filecmp.cmp(a, b, shallow=False)


def cli_bench(rounds):
    def timed(cmd):
        w = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        return time.perf_counter() - w
    exe = shutil.which("msprobe")
    base, helps = [], []
    for _ in range(rounds):
        base.append(timed([sys.executable, "-c", "pass"]))
        helps.append(timed([exe, "compare", "-h"] if exe else [sys.executable, "-m", "msprobe.cli.main", "compare", "-h"]))
    b, h = harness.median(base), harness.median(helps)
    print(f"\n[cli] msprobe compare -h {h:.3f} s; python -c pass {b:.3f} s ({h / b:.1f}x)")
    return {"compare_help_s": h, "python_s": b}


_ENGINE_CHILD = r"""
import json, resource, sys, time
from msprobe.core.compare import write_compare
t, g, out, engine, address = sys.argv[1:6]
w = time.perf_counter()
res = write_compare(t, g, out, keep_tables=False, progress=False, timestamp="20260101000000", engine=engine,
                    address=address or None)
print(json.dumps({"wall": time.perf_counter() - w, "pairs": len(res.results), "failed": len(res.failed_pairs),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_BASELINE_CHILD = r"""
import resource, sys
import pandas, msprobe.core.compare  # what every driver imports
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
import ray
ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False, logging_level="ERROR")
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""

ENGINE_TARGETS = {"ray/pool wall": 1.3, "driver MB": 300}


def gen_rank_stats(root, pairs, records):
    """target/golden step0/rank{r}/dump.json: about `records` tensor records a rank (multirank_compare.py's
    calls, three tensors each); the target's rank 5 (or last) drifts from a third of the way in."""
    import multirank_compare
    multirank_compare.PLANT_STEP = 0  # the one step generated: a divergence to diagnose, as in real use
    write_dumps = multirank_compare.write_dumps
    calls = max(3, records // 3)
    for side, planted in (("target", True), ("golden", False)):
        write_dumps(os.path.join(root, side), pairs, 1, calls, planted)
    return os.path.join(root, "target"), os.path.join(root, "golden"), calls * 3


def gen_rank_tensors(root, pairs, records=8, elements=1 << 16):
    """target (bf16-truncated) and golden step0/rank{r} tensor dumps of `records` calls a rank, an input
    and an output each; the ranks' .npy files are hard links of rank 0's (a dump's size on no more disk)."""
    rng = np.random.default_rng(1)
    first = {}
    for side in ("target", "golden"):
        for rank in range(pairs):
            d = os.path.join(root, side, "step0", f"rank{rank}")
            os.makedirs(os.path.join(d, "dump_tensor_data"))
            data = {}
            for i in range(records):
                key = f"Functional.linear.{i}.forward"
                rec = {"input_args": [], "input_kwargs": {}, "output": []}
                for role, slot in (("input", "input_args"), ("output", "output")):
                    name = f"{key}.{role}.0.npy"
                    path = os.path.join(d, "dump_tensor_data", name)
                    if (side, name) not in first:
                        golden = rng.standard_normal(elements).astype(np.float32)
                        arr = golden if side == "golden" else (golden.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
                        np.save(path, arr)
                        first[side, name] = (path, [float(arr.max()), float(arr.min()), float(arr.mean()),
                                                    float(np.linalg.norm(arr))])
                    else:
                        os.link(first[side, name][0], path)
                    st = first[side, name][1]
                    rec[slot].append({"type": "torch.Tensor", "dtype": "torch.float32" if side == "golden" else
                                      "torch.bfloat16", "shape": [elements], "Max": st[0], "Min": st[1],
                                      "Mean": st[2], "Norm": st[3], "requires_grad": True, "data_name": name})
                data[key] = rec
            with open(os.path.join(d, "dump.json"), "w") as f:
                json.dump({"task": "tensor", "level": "L1", "framework": "pytorch",
                           "dump_data_dir": os.path.join(d, "dump_tensor_data"), "data": data}, f)
    return os.path.join(root, "target"), os.path.join(root, "golden"), records * 2


def _ray_cluster(root):
    """A local head node (all CPUs) started with `ray start --block`: (process, address, start-up s)."""
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    exe = os.path.join(os.path.dirname(sys.executable), "ray")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    w = time.perf_counter()
    proc = subprocess.Popen([exe, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--block",
                             "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats",
                             f"--num-cpus={os.cpu_count()}", "--object-store-memory=100000000"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"127.0.0.1:{port}"
    probe = (f"import ray; ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False); "
             "print(int(ray.cluster_resources().get('CPU', 0)))")
    while True:
        if proc.poll() is not None:
            raise SystemExit("ray start --head exited")
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(os.cpu_count())]:
            return proc, address, time.perf_counter() - w, temp
        time.sleep(1)


def _stop_cluster(proc, temp):
    import signal
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 30)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
    shutil.rmtree(temp, ignore_errors=True)


def _free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _same_outputs(a, b):
    import filecmp
    names = sorted(n for n in os.listdir(a) if n.endswith((".csv", ".xlsx", ".json")))
    return names == sorted(n for n in os.listdir(b) if n.endswith((".csv", ".xlsx", ".json"))) and all(
        filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False) for n in names)


def engine_bench(root, pairs, records, tensor_pairs):
    print(f"\n[engines] rank pairs on the process pool and on Ray ({os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the start; a shared machine: walls are noisy)")
    print("driver MB: peak RSS (ru_maxrss) of the driver process alone, not of its workers or Ray's")
    w = time.perf_counter()
    stats = gen_rank_stats(os.path.join(root, "stats"), pairs, records)
    tensors = gen_rank_tensors(os.path.join(root, "tensors"), tensor_pairs)
    print(f"dumps generated in {time.perf_counter() - w:.0f} s")
    proc, address, startup, temp = _ray_cluster(root)
    print(f"ray start --head: {startup:.1f} s until the cluster took tasks (not in the walls below)")
    base = subprocess.run([sys.executable, "-c", _BASELINE_CHILD, address], capture_output=True, text=True)
    if base.returncode == 0:
        msprobe_mb, ray_mb = map(float, base.stdout.split()[-2:])
        print(f"driver before any pair: {msprobe_mb:.0f} MB (python, pandas, msprobe); {ray_mb:.0f} MB once "
              f"`import ray` and ray.init() attached to the cluster (Ray's own {ray_mb - msprobe_mb:.0f} MB)")
    rows = []
    try:
        for label, (t, g, per_rank), n in (("statistics L1", stats, pairs), ("tensor", tensors, tensor_pairs)):
            got = {}
            for engine in ("pool", "ray"):
                out = os.path.join(root, f"out_{label.split()[0]}_{engine}")
                run = subprocess.run([sys.executable, "-c", _ENGINE_CHILD, t, g, out, engine,
                                      address if engine == "ray" else ""], capture_output=True, text=True)
                if run.returncode != 0:
                    raise SystemExit(f"{engine}: {run.stderr[-2000:]}")
                got[engine] = json.loads(run.stdout.strip().splitlines()[-1])
                got[engine]["out"] = out
            same = _same_outputs(got["pool"]["out"], got["ray"]["out"])
            rows.append((label, n, per_rank, got["pool"], got["ray"], same))
    finally:
        _stop_cluster(proc, temp)
    print(f"{'dump':14s}{'pairs':>6s}{'rows/pair':>10s}{'pool s':>8s}{'ray s':>8s}{'ray/pool':>9s}"
          f"{'pool ms/pair':>13s}{'ray ms/pair':>12s}{'driver MB pool/ray':>20s}  same files")
    for label, n, per_rank, p, r, same in rows:
        print(f"{label:14s}{n:6d}{per_rank:10d}{p['wall']:8.1f}{r['wall']:8.1f}{r['wall'] / p['wall']:9.2f}"
              f"{1000 * p['wall'] / n:13.0f}{1000 * r['wall'] / n:12.0f}{p['rss_mb']:11.0f} /{r['rss_mb']:6.0f}  {same}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    big = rows[0]
    ratio, rss = big[4]["wall"] / big[3]["wall"], big[4]["rss_mb"]
    print(f"targets at {big[1]} pairs: Ray within {ENGINE_TARGETS['ray/pool wall']}x of the pool's wall: "
          f"{ratio:.2f}x ({'met' if ratio <= ENGINE_TARGETS['ray/pool wall'] else 'missed'}); driver RSS <= "
          f"{ENGINE_TARGETS['driver MB']} MB: {rss:.0f} MB ({'met' if rss <= ENGINE_TARGETS['driver MB'] else 'missed'})")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensor-gb", type=float, default=0.2, help="total size of the tensor pair (default 0.2)")
    ap.add_argument("--records", type=int, default=100_000, help="tensor records per statistics dump")
    harness.add_common_options(ap, rounds=3, quick=(1,))
    ap.add_argument("--dir", help="where to generate (default: a temporary folder, removed at the end)")
    ap.add_argument("--skip", nargs="*", default=(), choices=("tensor", "statistics", "cli"))
    ap.add_argument("--baseline-src", help="the src/ folder of an older checkout (e.g. from `git archive`): its "
                    "compare runs interleaved with this one's, for new/old ratios")
    ap.add_argument("--cold", action="store_true", help="tensor files read from disk: evicted from the page "
                    "cache before each run")
    ap.add_argument("--engine", choices=("pool", "ray"), default="pool",
                    help="ray: measure only the rank pairs on the process pool against Ray (section 4)")
    ap.add_argument("--pairs", type=int, default=1024, help="--engine ray: statistics rank pairs (default 1024)")
    ap.add_argument("--pair-records", type=int, default=2000, help="--engine ray: tensor records a rank")
    ap.add_argument("--tensor-pairs", type=int, default=64, help="--engine ray: tensor-mode rank pairs")
    args = ap.parse_args()
    harness.check_common_options(ap, args)
    if args.quick:
        args.tensor_gb, args.records = min(args.tensor_gb, 0.05), min(args.records, 10_000)
    global BASELINE_SRC, COLD
    COLD = args.cold
    BASELINE_SRC = os.path.abspath(args.baseline_src) if args.baseline_src else None
    root = args.dir or tempfile.mkdtemp(prefix="msprobe_cmpbench_")
    os.makedirs(root, exist_ok=True)
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; files in {root}")
    try:
        if args.engine == "ray":
            engine_bench(root, args.pairs, args.pair_records, args.tensor_pairs)
            return 0
        numbers = {}
        if "tensor" not in args.skip:
            numbers["tensor"] = tensor_bench(os.path.join(root, "tensor"), args.tensor_gb, args.rounds)
        if "statistics" not in args.skip:
            numbers["statistics"] = stats_bench(root, args.records, args.rounds)
        if "cli" not in args.skip:
            numbers["cli"] = cli_bench(max(5, args.rounds))
        harness.write_json(args.json, numbers)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("compare_throughput.py", main,
                          heading="compare_throughput.py --engine ray" if "ray" in sys.argv else None))

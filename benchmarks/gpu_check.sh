#!/usr/bin/env bash
# The GPU checks in one run (a machine with CUDA, no network): the CUDA tests, then the dump overhead of
# the gpt workload (Triton kernels, and torch's reductions for comparison), the host cost per record of
# the device path (host_cost.py --device cuda), profiles of a dumped step (cProfile; py-spy of every
# thread when its wheel is in .whl/) while the run is under 7-8 minutes (one command on the device machine gets
# 10), then, with GPU_CHECK_ALL=1, torch's reductions and tensor_L1's write rate.
# Usage: bash benchmarks/gpu_check.sh OUT_DIR   (wheels msprobe needs beyond torch in .whl/, if any)
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD/src:/tmp/site:$PWD/benchmarks PYTHONUNBUFFERED=1
python3 setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1 || { tail "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/gpu tests/pytorch/test_device_summary.py 2>&1 \
    | tee "$OUT/tests.log" | tail -15
BENCH="python3 benchmarks/dump_overhead.py --device cuda --quiet --tmpdir $PWD/.bench_tmp"
mkdir -p .bench_tmp
timeout 300 $BENCH --record --rounds 5 --steps 5 --configs none,stat_L0,stat_L1,stat_mix,md5_L1,stat_L1_async \
    2>&1 | tee "$OUT/bench_triton.log"
timeout 150 python3 benchmarks/host_cost.py --device cuda --rounds 3 --steps 3 --configs L0,L1,mix,md5_L1 \
    2>/dev/null | tee "$OUT/host_cost_cuda.log"
# µs a record call and the batch reads inside real CUDA steps (the parts the CPU's kernels/rec stands for)
timeout 90 python3 benchmarks/host_cost.py --device cuda --record-calls --rounds 3 --steps 3 --configs L0,L1 \
    2>/dev/null | tee "$OUT/record_calls_cuda.log"
cp benchmarks/RESULTS.md "$OUT/RESULTS.md" 2>/dev/null
[ "$SECONDS" -lt 420 ] && timeout 120 python3 benchmarks/dump_overhead.py --device cuda --profile stat_L1 --steps 3 --top 40 \
    --profile-out "$OUT/profile_L1.txt" > /dev/null 2>&1
if [ -x /tmp/site/bin/py-spy ] && [ "$SECONDS" -lt 480 ]; then  # every thread, autograd's device thread too (py-spy's wheel in .whl/)
    timeout 60 /tmp/site/bin/py-spy record --threads --format raw -r 250 -o "$OUT/pyspy_stat_L0.txt" -- \
        python3 benchmarks/dump_overhead.py --device cuda --profile stat_L0 --steps 20 --plain > /dev/null 2>&1
fi
if [ "${GPU_CHECK_ALL:-0}" = 1 ]; then  # torch's reductions instead of Triton; tensor_L1's write rate
    MSPROBE_TRITON=0 timeout 150 $BENCH --rounds 3 --steps 5 --configs none,stat_L1,md5_L1 \
        2>&1 | tee "$OUT/bench_torch_ops.log"
    timeout 150 $BENCH --gpt-blocks 1 --rounds 3 --steps 2 --configs none,tensor_L1 \
        2>&1 | tee "$OUT/bench_tensor.log"
fi
rm -rf .bench_tmp

"""Run a script as N real torch.distributed processes on the gloo backend (127.0.0.1, a free port)."""

import os
import socket
import subprocess
import sys


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script, world, args, timeout=240):
    """Run `script args...` as ranks 0..world-1; returns each rank's stdout. A failing rank fails with
    every rank's output; all ranks are killed on timeout."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script), *map(str, args)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = [f"rank {r} exit {rc}:\n{out}\n{err[-4000:]}" for r, (rc, out, err) in enumerate(outs) if rc != 0]
    assert not failed, "\n".join(failed)
    return [out for _, out, _ in outs]

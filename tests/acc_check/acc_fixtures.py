"""Plain helpers of the acc_check tests. Not in conftest.py: `from conftest import` resolves to whichever
test folder's conftest a full run imported first."""

import os
from pathlib import Path

SEED_WHERE = str(Path(__file__).resolve().parents[1] / "data" / "msprobe-samples" / "acc_check"
                 / "seed_ms_mint_where_dump.json")


def dump_json_of(dump_path, step=0):
    from msprobe.core.dump.reader import find_rank_dirs
    rank = [r for r in find_rank_dirs(str(dump_path)) if r.step == step][0]
    return os.path.join(rank.path, "dump.json")


def tensors_left_in_cycles(dump_json, create_executor, tensor_type):
    """(tensors that only the cyclic collector would free after checking every API of the dump, how
    many APIs were checked): the executor must free each API's tensors when its check returns."""
    from cyclic_garbage import cyclic_garbage_of
    from msprobe.core.acc_check.input_data import TensorSource, rng_for
    from msprobe.core.acc_check.runner import load_dump
    reader, cases = load_dump(dump_json)
    executor, source = create_executor(), TensorSource(reader)

    def check_all():
        for case in cases:
            executor.run(case, source, rng_for(case.name))
    return [o for _, o in cyclic_garbage_of(check_all) if isinstance(o, tensor_type)], len(cases)


def lowprec_dump(framework, dump_path):
    """An L1 statistics dump of the planted low-precision custom matmul and its correct twin, registered
    with register_custom_api from lowprec_ops.py (PyTorch) or ms_lowprec_ops.py (MindSpore). Returns the
    dump.json path."""
    import importlib
    import sys
    import numpy as np
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    try:
        ops = importlib.import_module("lowprec_ops" if framework == "pytorch" else "ms_lowprec_ops")
        adapter = importlib.import_module(f"msprobe.{framework}")
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((16, 64)).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)
        if framework == "pytorch":
            import torch
            a, b = torch.from_numpy(a), torch.from_numpy(b)
        else:
            import mindspore
            a, b = mindspore.Tensor(a), mindspore.Tensor(b)
        dbg = adapter.PrecisionDebugger(dump_path=str(dump_path), level="L1", task="statistics")
        dbg.register_custom_api(ops, "matmul_fp16_inside", "LowPrec")
        dbg.register_custom_api(ops, "matmul_exact", "LowPrec")
        dbg.start()
        ops.matmul_fp16_inside(a, b)
        ops.matmul_exact(a, b)
        dbg.stop()
        dbg.step()
        dbg.close()
    finally:
        sys.path.remove(here)
    return dump_json_of(dump_path)

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


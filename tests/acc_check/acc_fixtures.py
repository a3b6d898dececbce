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


def cyclic_garbage_of(check, *args):
    """Objects that only the cyclic collector would free after `check(*args)`: [(type name, object)].

    An executor that leaves its inputs in a reference cycle keeps every API's tensors alive until a
    collection runs (allocations made by the framework do not trigger one), so a worker's heap grows with
    the dump instead of staying at one API's size.
    """
    import gc
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        check(*args)
        gc.collect()
        return [(type(o).__name__, o) for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()

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


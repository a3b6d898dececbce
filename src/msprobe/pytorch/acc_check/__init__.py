"""acc_check executor for PyTorch dumps: resolve a dump name to a torch callable, rebuild its
arguments, run it on the device under test and on the CPU in float64 (forward and backward).

    from msprobe.pytorch.acc_check import run_acc_check
    report = run_acc_check("dump_path/step0/rank0/dump.json", out_path="./acc")
"""

from msprobe.core.acc_check.runner import run_acc_check, run_multi_acc_check

__all__ = ["run_acc_check", "run_multi_acc_check"]

"""Run in a fresh process by test_quiet_defaults.py: train each example model of one framework under
`examples/monitor_config.json` for 20 normal steps, then again with a gradient spike and with a NaN
planted at PLANT_STEP, and print what the monitor reported as JSON.

    python tests/monitor/quiet_runs.py pytorch OUTPUT_ROOT
"""

import json
import os
import sys

from private_modules import load_private

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "examples", "monitor_config.json")
NORMAL_STEPS = 20
PLANT_STEP = 6


def main(framework, out_root):
    if framework == "pytorch":
        import torch
        torch.set_num_threads(1)   # tiny models: one thread is the fastest and steadiest on a shared machine
    train = load_private("msprobe_example_train", os.path.join(ROOT, "examples", "train.py"))
    report = {}
    for model in ("mlp", "transformer", "cnn"):
        runs = {"normal": (None, None), "spike": ("spike", PLANT_STEP), "nan": ("nan", PLANT_STEP)}
        for run, plant in runs.items():
            os.environ["MONITOR_OUTPUT_DIR"] = os.path.join(out_root, f"{model}-{run}")
            steps = NORMAL_STEPS if plant[0] is None else PLANT_STEP + 1
            _, mon = train.train(framework, model, steps, monitor=CONFIG, plant=plant)
            report[f"{model}-{run}"] = {"anomalies": len(mon.anomalies), "steps": steps,
                                        "first": mon.anomalies[0] if mon.anomalies else None,
                                        "output_root": os.environ["MONITOR_OUTPUT_DIR"]}
    print(json.dumps(report))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(sys.argv[1], sys.argv[2])

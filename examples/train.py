"""Train one of the example models for a few steps, optionally under msprobe's dump or training monitor.
The README's tour runs it.

    python examples/train.py --model transformer --dump ./run_fp32                  # one step, dumped at mix
    python examples/train.py --model transformer --dump ./run_bf16 --plant bf16-softmax
    python examples/train.py --model cnn --steps 20 --monitor examples/monitor_config.json
    python examples/train.py --framework mindspore --model cnn --dump ./ms_run --level L1

Plants (each a difference msprobe should find): `bf16-softmax` (PyTorch transformer: block 1's softmax
in bfloat16), `spike@N` (the loss, so every gradient, x1000 at step N), `nan@N` (the loss times NaN at
step N).
"""

import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_plant(text):
    """'bf16-softmax' -> ('bf16-softmax', None); 'spike@12' -> ('spike', 12); 'nan@3' -> ('nan', 3)."""
    if text in (None, "bf16-softmax"):
        return text, None
    kind, _, step = text.partition("@")
    if kind not in ("spike", "nan") or not step.isdigit():
        raise argparse.ArgumentTypeError(f"--plant {text!r}: allowed: bf16-softmax | spike@STEP | nan@STEP")
    return kind, int(step)


def loss_scale(plant, step):
    """What the loss is multiplied by at `step` (1.0 unless a spike or NaN is planted there)."""
    kind, at = plant
    if at != step:
        return 1.0
    return 1000.0 if kind == "spike" else math.nan


def workload(framework, model, seed=0, plant=(None, None)):
    """The example model `model` of `framework` with its optimizer and data."""
    sys.path.insert(0, HERE)
    if framework == "mindspore":
        import mindspore
        mindspore.runtime.launch_blocking()   # ops on the Python thread: ~4x faster steps on a small CPU
        import mindspore_models
        if plant[0] == "bf16-softmax":
            raise SystemExit("--plant bf16-softmax: only for --framework pytorch")
        return mindspore_models.Workload(model, seed)
    import pytorch_models
    if plant[0] == "bf16-softmax" and model != "transformer":
        raise SystemExit("--plant bf16-softmax: only for --model transformer")
    return pytorch_models.Workload(model, seed, low_precision_softmax=plant[0] == "bf16-softmax")


def train(framework="pytorch", model="transformer", steps=1, dump=None, level="mix", config=None,
          monitor=None, plant=(None, None), seed=0):
    """Train `steps` steps; dump them with a PrecisionDebugger (`dump`, `level` or a `config` file) and/or
    watch them with a TrainerMon (`monitor`: its config file).

    Returns:
        (losses, the TrainerMon or None)
    """
    work = workload(framework, model, seed, plant)
    adapter = __import__(f"msprobe.{framework}", fromlist=["PrecisionDebugger", "TrainerMon"])
    debugger = None
    if config is not None:
        debugger = adapter.PrecisionDebugger(config_path=config)
    elif dump is not None:
        debugger = adapter.PrecisionDebugger(dump_path=dump, task="statistics", level=level)
    mon = None
    if monitor is not None:
        mon = adapter.TrainerMon(monitor)
        mon.set_monitor(work.model, grad_acc_steps=1, optimizer=work.optimizer)
    losses = []
    for step in range(steps):
        if debugger is not None:
            debugger.start(work.model)
        losses.append(work.train_step(loss_scale(plant, step)))
        if debugger is not None:
            debugger.stop()
            debugger.step()
    if debugger is not None:
        debugger.close()
    if mon is not None:
        mon.close()
    return losses, mon


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=("pytorch", "mindspore"), default="pytorch")
    parser.add_argument("--model", choices=("mlp", "transformer", "cnn"), default="transformer")
    parser.add_argument("--steps", type=int, default=1, help="training steps (default 1)")
    parser.add_argument("--dump", metavar="PATH", help="dump every step here (task statistics)")
    parser.add_argument("--level", choices=("L0", "L1", "mix"), default="mix", help="dump level (default mix)")
    parser.add_argument("--config", metavar="CONFIG_JSON", help="dump with this PrecisionDebugger config.json")
    parser.add_argument("--monitor", metavar="CONFIG_JSON", help="watch training with this TrainerMon config")
    parser.add_argument("--plant", type=parse_plant, default=(None, None),
                        help="bf16-softmax | spike@STEP | nan@STEP")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    losses, mon = train(args.framework, args.model, args.steps, args.dump, args.level, args.config, args.monitor,
                        args.plant, args.seed)
    print(f"{args.framework} {args.model}: {len(losses)} steps, loss {losses[0]:.6f} -> {losses[-1]:.6f}")
    if mon is not None:
        print(f"monitor: {len(mon.anomalies)} anomalies; rows in {os.path.abspath(mon.output_dir)}")
        if mon.anomalies:
            print(f"  first: {mon.anomalies[0]['message']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

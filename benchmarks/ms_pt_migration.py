"""The migration compare: a MindSpore twin (target) against its PyTorch original (golden), with one
planted difference in the MindSpore twin or none, `compare` + `diagnose` with no mapping flags.

Twins: tests/compare/ms_pt_twins.py, written the way each framework is usually written, the same
weights in both, two training steps. Two families: "vision" (the one the tables and thresholds were
tuned on) and "text" (held out: looked at only to measure). Per run: whether the first suspect is the
plant, false alarms on the negatives (identical twins; the same math through other ops), whether the
run is "mostly unmatched", and the share of target values that found their golden partner (values
inside a call the golden run makes as one, such as nn.Dense's MatMul output, do not count), overall
and for the common layers (without the layout calls the twins write differently on purpose), with
the list of common-layer values left unpaired.

    python benchmarks/ms_pt_migration.py                     # both families, mix and L1 (a few minutes)
    python benchmarks/ms_pt_migration.py --families vision --levels mix
    python benchmarks/ms_pt_migration.py --record            # into RESULTS.md
"""

import argparse
import importlib.util
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TWINS_PATH = os.path.join(os.path.dirname(HERE), "tests", "compare", "ms_pt_twins.py")
HELD_OUT = ("text",)
LEVELS = ("mix", "L1")
STEPS = 2

# where each plant is: a part of the first suspect's API or module names, or of its model source line
PLANT_MARKS = {
    "conv_weight": ("conv", "self.conv("),
    "ln_eps": ("norm1", "self.norm1("),
    "gelu_tanh": ("gelu", "GELU", "GeLU", "self.act("),
    "attn_scale": ("* self.scale",),
    "residual_scale": ("self.residual",),
    "softmax_fp16": ("float16",),
    "bprop_scale": ("grad_scale", "GradScale"),
    "weight_decay": ("SGD", "Adam", "head.Dense", "head.weight"),
}


def load_twins():
    spec = importlib.util.spec_from_file_location("msprobe_bench_ms_pt_twins", TWINS_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dump_pair(twins, root, family, level, plant):
    """(MindSpore dump dir, PyTorch dump dir, MindSpore losses, PyTorch losses) of one scenario."""
    from msprobe.mindspore import PrecisionDebugger as MsDebugger
    from msprobe.pytorch import PrecisionDebugger as PtDebugger
    x, y = twins.make_data(family)
    ms_dir = os.path.join(root, f"{family}-{level}-{plant}-ms")
    pt_dir = os.path.join(root, f"{family}-{level}-pt")
    ms_net = twins.build_ms(family, None)  # the PyTorch twin takes the clean weights
    pt_net = twins.build_pt(family, ms_net)
    if plant is not None:
        ms_net = twins.build_ms(family, plant)
    debugger = MsDebugger(dump_path=ms_dir, task="statistics", level=level)
    ms_losses = twins.train_ms(family, ms_net, x, y, plant, debugger, steps=STEPS)
    debugger.close()
    pt_losses = None
    if not os.path.isdir(pt_dir):
        debugger = PtDebugger(dump_path=pt_dir, task="statistics", level=level)
        pt_losses = twins.train_pt(family, pt_net, x, y, debugger, steps=STEPS)
        debugger.close()
    return ms_dir, pt_dir, ms_losses, pt_losses


def paired_share(results):
    """(paired, countable, common paired, common countable, unpaired names) of the target's values.
    INSIDE_FUSED rows (values golden holds inside one call) are not countable; the common-layer share
    also leaves out the unpaired rows of layout calls (reshape/transpose/cast) the twins write
    differently on purpose: what is left are the layers both programs have."""
    from msprobe.core.compare.matching import INSIDE_FUSED
    from msprobe.core.diagnosis.thresholds import VALUE_PRESERVING_APIS
    paired = countable = c_paired = c_countable = 0
    unpaired = []
    for r in results:
        gidx = r.rows.gidx
        names = r.table["NPU Name"]
        keys = r.rows.target["key"].astype(str)
        api = keys.str.rsplit(".", n=2).str[0].str.rsplit(".", n=1).str[-1]
        paired += int((gidx >= 0).sum())
        countable += int((gidx != INSIDE_FUSED).sum())
        common = (gidx != INSIDE_FUSED) & ~((gidx < 0) & api.isin(VALUE_PRESERVING_APIS).to_numpy())
        c_paired += int((gidx[common] >= 0).sum())
        c_countable += int(common.sum())
        unpaired += names[common & (gidx < 0)].tolist()
    return paired, countable, c_paired, c_countable, unpaired


def named(suspect, plant):
    text = " ".join(str(suspect.get(k) or "") for k in ("api", "module", "stack"))
    text += " " + " ".join(suspect.get("module_path") or [])
    text += " " + " ".join(str(r.get("origin") or "") for r in suspect.get("inputs") or [])
    return any(mark in text for mark in PLANT_MARKS[plant])


def run_one(twins, root, family, level, plant):
    from msprobe.core.compare import compare_dumps
    from msprobe.core.diagnosis import diagnose
    ms_dir, pt_dir, _, _ = dump_pair(twins, root, family, level, plant)
    results = compare_dumps(ms_dir, pt_dir, progress=False)
    d = diagnose(results)
    paired, countable, c_paired, c_countable, unpaired = paired_share(results)
    top = d["suspects"][0] if d["suspects"] else None
    return {"family": family, "level": level, "plant": plant or "identical",
            "divergence": d["divergence"], "mostly_unmatched": d["mostly_unmatched"],
            "top": None if top is None else f"{top.get('api')} ({top.get('kind')}, step {top.get('step')})",
            "named": bool(top is not None and plant in PLANT_MARKS and named(top, plant)),
            "paired": paired, "countable": countable, "common_paired": c_paired, "common_countable": c_countable,
            "unpaired": unpaired}


def table_text(runs):
    lines = ["| family | level | plants named first | false alarms | mostly unmatched | values paired "
             "| common-layer values paired (lowest run) |",
             "|---|---|---|---|---|---|---|"]
    groups = {}
    for r in runs:
        groups.setdefault((r["family"], r["level"]), []).append(r)
    for (family, level), rs in groups.items():
        plants = [r for r in rs if r["plant"] in PLANT_MARKS]
        negatives = [r for r in rs if r["plant"] not in PLANT_MARKS]
        paired = sum(r["paired"] for r in rs)
        countable = sum(r["countable"] for r in rs)
        c_paired = sum(r["common_paired"] for r in rs)
        c_countable = sum(r["common_countable"] for r in rs)
        lowest = min(common_share(r) for r in rs)
        suite = f"{family} ({'held out' if family in HELD_OUT else 'tuning'})"
        lines.append(f"| {suite} | {level} | {sum(r['named'] for r in plants)}/{len(plants)} | "
                     f"{sum(r['divergence'] for r in negatives)}/{len(negatives)} | "
                     f"{sum(r['mostly_unmatched'] for r in rs)}/{len(rs)} | "
                     f"{100.0 * paired / max(countable, 1):.1f} % | "
                     f"{100.0 * c_paired / max(c_countable, 1):.1f} % ({100.0 * lowest:.1f} %) |")
    lines += ["", "| family | level | scenario | first suspect | named | common-layer values paired |",
              "|---|---|---|---|---|---|"]
    for r in runs:
        mark = ("yes" if r["named"] else "NO") if r["plant"] in PLANT_MARKS else (
            "false alarm" if r["divergence"] else "no divergence")
        lines.append(f"| {r['family']} | {r['level']} | {r['plant']} | {r['top'] or '-'} | {mark} | "
                     f"{100.0 * common_share(r):.1f} % |")
    unpaired = {}
    for r in runs:
        for name in r["unpaired"]:
            unpaired.setdefault(name, set()).add(f"{r['family']}/{r['level']}")
    if unpaired:
        lines += ["", "Common-layer target values left unpaired (runs):"]
        lines += [f"  {name}: {', '.join(sorted(where))}" for name, where in sorted(unpaired.items())]
    return "\n".join(lines)


def common_share(run):
    return run["common_paired"] / max(run["common_countable"], 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="vision,text", help="comma list of vision, text")
    parser.add_argument("--levels", default=",".join(LEVELS), help="comma list of mix, L1")
    parser.add_argument("--scenarios", default=None, help="comma list of plants/negatives (default: all)")
    parser.add_argument("--json", help="write every run's outcome here")
    args = parser.parse_args()
    twins = load_twins()
    families = [f for f in args.families.split(",") if f]
    levels = [v for v in args.levels.split(",") if v]
    scenarios = [s for s in (args.scenarios or ",".join(twins.PLANTS + twins.NEGATIVES)).split(",") if s]
    for name, values, allowed in (("--families", families, ("vision", "text")), ("--levels", levels, LEVELS),
                                  ("--scenarios", scenarios, twins.PLANTS + twins.NEGATIVES)):
        for v in values:
            if v not in allowed:
                parser.error(f"{name}: '{v}'; allowed: {', '.join(allowed)}")
    import mindspore
    import torch
    torch.set_num_threads(1)
    runs = []
    with tempfile.TemporaryDirectory() as root:
        for family in families:
            for level in levels:
                for s in scenarios:
                    plant = None if s == "identical" else s
                    runs.append(run_one(twins, root, family, level, plant))
                    print(f"{family} {level} {s}: {runs[-1]['top']}; common-layer values paired "
                          f"{100.0 * common_share(runs[-1]):.1f} %", file=sys.stderr, flush=True)
    print(f"MindSpore {mindspore.__version__} (CPU, PyNative) twins against PyTorch {torch.__version__}, "
          f"{STEPS} training steps, statistics dumps, no mapping flags (ms_pt_migration.py):\n")
    print(table_text(runs))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("ms_pt_migration.py", main))

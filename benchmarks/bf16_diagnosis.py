"""Does the diagnosis find planted bugs inside a bf16-autocast run compared with an fp32 golden, and
does it stay quiet when there is no bug? Hits and false alarms of `msprobe compare`'s diagnosis and of
three simpler rules, on the same dumps, in statistics and tensor mode, at level L1 and mix.

The suite is tests/compare/autocast_plants.py: a small transformer, one planted bug per target run (wrong
epsilon, perturbed weight, wrong scale, a cast to a precision below autocast's, an fp16 overflow),
and negative controls that only run under autocast (bf16 with two seeds, fp16); the diagnosis'
thresholds were set on it. A small CNN with the same kinds of plants is held out: it was written after
they were set, and its numbers are reported as they came.

    python benchmarks/bf16_diagnosis.py --record             # all four configs (a few minutes), into RESULTS.md
    python benchmarks/bf16_diagnosis.py --configs statistics:mix
    python benchmarks/bf16_diagnosis.py --json out.json      # also every run's suspect #1
    python benchmarks/bf16_diagnosis.py --models none --negatives gru,mha   # only some clean families

Clean models of other shapes (tests/compare/bf16_negatives.py: attention variants with learned, rotary and
ALiBi positions, layout-only rewrites, convs with batch norm, temporal and depthwise-separable convs,
recurrent cells stepped by hand, a long RMSNorm residual stream, an EmbeddingBag recommender, a selective
scan, a U-Net, a top-2 mixture of experts, a ViT, instance/group-norm convs, attention pooling over padded
sequences; bf16 autocast, a few under fp16), two seeds each, give the second table: false alarms per
family, in the half the diagnosis was changed on (`tuning`) and the half it was not (`held out`).

Columns: `hits` = suspect #1 is the planted call; `wrong place named` = #1 is elsewhere; `false alarms`
= a negative control reported as a divergence; for the diagnosis also the plant runs that list another
strong suspect after #1 (more places a user is sent to look). The rules:
`max error` names the call of the row whose l2norm is relatively furthest off; `first >50%` the first
call with a statistic off by more than 50% (msProbe `-da`'s threshold); `first error` the call of the
first row whose Result is `error`. Rules name something on every run, so a control always counts as
their false alarm unless no row qualifies. Writes its section of benchmarks/RESULTS.md.
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
sys.path.insert(0, TESTS)  # the planted-bug and clean models are the tests' (tests/compare/)
from private_modules import load_private  # noqa: E402

plants = load_private("msprobe_bench_autocast_plants", os.path.join(TESTS, "compare", "autocast_plants.py"))
negatives = load_private("msprobe_bench_bf16_negatives", os.path.join(TESTS, "compare", "bf16_negatives.py"))

from msprobe.core.compare.engine import compare_dumps  # noqa: E402
from msprobe.core.diagnosis import diagnose  # noqa: E402

CONFIGS = ("statistics:L1", "statistics:mix", "tensor:L1", "tensor:mix")
HELD_OUT = ("cnn", "mixer")  # planted after the diagnosis' thresholds were set on the transformer


def _call_of(row_name):
    for marker in (".input.", ".output.", ".parameters.", ".parameters_grad."):
        if marker in row_name:
            return row_name.split(marker, 1)[0]
    return row_name


def _stat(cell):
    try:
        return float(cell)
    except (TypeError, ValueError):
        return math.nan


def rule_max_error(table):
    """The call of the row whose l2norm is relatively furthest off (inf/nan first)."""
    best, name = -1.0, None
    for n, b, t, g in zip(table["NPU Name"], table["Bench Name"], table["NPU l2norm"], table["Bench l2norm"]):
        if b == "N/A":
            continue
        t, g = _stat(t), _stat(g)
        if math.isnan(t) and math.isnan(g):
            continue
        err = math.inf if not math.isfinite(t) or not math.isfinite(g) else abs(t - g) / max(abs(g), 1e-30)
        if err > best:
            best, name = err, n
    return _call_of(name) if name else None


def rule_first_over_half(table):
    """The first call with Max, Min, Mean or Norm off by more than 50% (msProbe -da's threshold)."""
    for n, b, *stats in zip(table["NPU Name"], table["Bench Name"], table["NPU max"], table["NPU min"],
                            table["NPU mean"], table["NPU l2norm"], table["Bench max"], table["Bench min"],
                            table["Bench mean"], table["Bench l2norm"]):
        if b == "N/A":
            continue
        t, g = [_stat(v) for v in stats[:4]], [_stat(v) for v in stats[4:]]
        for a, c in zip(t, g):
            if math.isnan(a) and math.isnan(c):
                continue
            if not (math.isfinite(a) and math.isfinite(c)) or abs(a - c) > 0.5 * abs(c):
                return _call_of(n)
    return None


def rule_first_error(table):
    bad = table[table["Result"] == "error"]
    return _call_of(bad["NPU Name"].iloc[0]) if len(bad) else None


RULES = {"max error": rule_max_error, "first >50%": rule_first_over_half, "first error": rule_first_error}


def run_config(root, model, task, level, log):
    """{run name: {"diagnosis": suspect #1 api or None, "divergence": bool, rule: call or None}}."""
    out = {}
    goldens = {}
    for seed in sorted({s for s, _ in plants.CONTROLS.values()}):
        goldens[seed] = plants.dump_run(os.path.join(root, f"{model}_{task}_{level}_golden{seed}"), None, task=task,
                                        level=level, seed=seed, model=model)
    runs = [(p, p, 0, torch.bfloat16) for p in plants.MODELS[model][2]]
    runs += [(name, None, seed, dtype) for name, (seed, dtype) in plants.CONTROLS.items()]
    for name, plant, seed, dtype in runs:
        t0 = time.perf_counter()
        target = plants.dump_run(os.path.join(root, f"{model}_{task}_{level}_{name}"), plant, task=task,
                                 level=level, autocast=dtype, seed=seed, model=model)
        results = compare_dumps(target, goldens[seed], progress=False, workers=1)
        d = diagnose(results)
        top = d["suspects"][0] if d["suspects"] else None
        entry = {"plant": plant, "divergence": bool(d["divergence"]), "verdict": d["verdict"],
                 "diagnosis": top["api"] if top and d["divergence"] else None,
                 "hit": bool(plant and top and d["divergence"] and plants.hit(plant, top, model)),
                 # strong suspects after #1 that are not the plant: more places a user is sent to look
                 "others": sum(1 for s in d["suspects"][1:] if s["tier"] == "strong"
                               and not (plant and plants.hit(plant, s, model)))}
        for rule, fn in RULES.items():
            call = fn(results[0].table)
            entry[rule] = call
            entry[rule + " hit"] = bool(plant and call and plants.hit(plant, {"api": call}, model))
        out[name] = entry
        log(f"{model:11s} {task:10s} {level:3s} {name:18s} {'hit ' if entry['hit'] else 'miss' if plant else '    '} "
            f"{entry['diagnosis']!s:38s} {time.perf_counter() - t0:5.1f}s  {d['verdict'][:90]}")
    return out


def summary(runs):
    """(hits, plants, false alarms, controls) per method."""
    n_plants = sum(1 for r in runs.values() if r["plant"])
    n_controls = len(runs) - n_plants
    rows = {}
    hits = sum(r["hit"] for r in runs.values() if r["plant"])
    wrong = sum(1 for r in runs.values() if r["plant"] and r["divergence"] and not r["hit"])
    alarms = sum(r["divergence"] for r in runs.values() if not r["plant"])
    others = sum(1 for r in runs.values() if r["plant"] and r["others"])
    rows["msprobe diagnosis"] = (hits, n_plants, alarms, n_controls, wrong, others)
    for rule in RULES:
        rows[rule] = (sum(r[rule + " hit"] for r in runs.values() if r["plant"]), n_plants,
                      sum(bool(r[rule]) for r in runs.values() if not r["plant"]), n_controls,
                      sum(1 for r in runs.values() if r["plant"] and r[rule] and not r[rule + " hit"]), None)
    return rows


def table_text(by_config):
    lines = ["| suite | config | method | hits | wrong place named | false alarms on controls | "
             "plant runs with another strong suspect |",
             "|---|---|---|---|---|---|---|"]
    for (model, config), runs in by_config.items():
        suite = f"{model} ({'held out' if model in HELD_OUT else 'tuning'})"
        for method, (hits, n, alarms, m, wrong, others) in summary(runs).items():
            extra = "-" if others is None else f"{others}/{n}"
            lines.append(f"| {suite} | {config} | {method} | {hits}/{n} | {wrong}/{n} | {alarms}/{m} | {extra} |")
    return "\n".join(lines)


def run_negatives(root, family, task, level, log):
    """{seed: {"divergence": bool, "verdict": str, "diagnosis": suspect #1 api or None}} of one clean family."""
    out = {}
    for seed in negatives.SEEDS:
        t0 = time.perf_counter()
        stem = os.path.join(root, f"neg_{family}_{task}_{level}_{seed}")
        golden = negatives.dump_run(stem + "_golden", family, task=task, level=level, seed=seed, golden_layout=True)
        target = negatives.dump_run(stem + "_target", family, task=task, level=level, seed=seed,
                                    autocast=negatives.AUTOCAST.get(family, torch.bfloat16))
        d = diagnose(compare_dumps(target, golden, progress=False, workers=1))
        top = d["suspects"][0]["api"] if d["suspects"] and d["divergence"] else None
        out[seed] = {"divergence": bool(d["divergence"]), "verdict": d["verdict"], "diagnosis": top}
        log(f"negative {family:13s} {task:10s} {level:3s} seed {seed} {'ALARM' if d['divergence'] else 'quiet'} "
            f"{time.perf_counter() - t0:5.1f}s  {d['verdict'][:100]}")
    return out


def negatives_text(by_family):
    lines = ["| family | half | config | false alarms | suspect #1 of an alarm |", "|---|---|---|---|---|"]
    totals = {}
    for (family, config), runs in by_family.items():
        half = negatives.FAMILIES[family][0]
        alarms = [r for r in runs.values() if r["divergence"]]
        t = totals.setdefault(half, [0, 0])
        t[0] += len(alarms)
        t[1] += len(runs)
        named = ", ".join(sorted({r["diagnosis"] for r in alarms if r["diagnosis"]})) or "-"
        lines.append(f"| {family} | {half} | {config} | {len(alarms)}/{len(runs)} | {named} |")
    lines.append("")
    lines.append("False alarms per half: " + "; ".join(f"{h} {a}/{n}" for h, (a, n) in totals.items()) + ".")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma list of task:level")
    parser.add_argument("--models", default=",".join(plants.MODELS),
                        help="comma list of suite models, or none")
    parser.add_argument("--negatives", default=",".join(negatives.FAMILIES),
                        help="comma list of clean families (bf16_negatives.py), or none")
    parser.add_argument("--json", help="write every run's outcome here")
    parser.add_argument("--quiet", action="store_true", help="no line per run")
    args = parser.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            parser.error(f"--configs: '{c}'; allowed: {', '.join(CONFIGS)}")
    models = [m.strip() for m in args.models.split(",") if m.strip() and m.strip() != "none"]
    for m in models:
        if m not in plants.MODELS:
            parser.error(f"--models: '{m}'; allowed: {', '.join(plants.MODELS)} or none")
    families = [f.strip() for f in args.negatives.split(",") if f.strip() and f.strip() != "none"]
    for f in families:
        if f not in negatives.FAMILIES:
            parser.error(f"--negatives: '{f}'; allowed: {', '.join(negatives.FAMILIES)} or none")
    torch.set_num_threads(1)  # the same rounding on every machine
    log = (lambda *_: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    by_config, by_family = {}, {}
    with tempfile.TemporaryDirectory() as root:
        for model in models:
            for c in configs:
                task, level = c.split(":")
                by_config[(model, c)] = run_config(root, model, task, level, log)
        for family in families:
            for c in configs:
                task, level = c.split(":")
                by_family[(family, c)] = run_negatives(root, family, task, level, log)
    if by_config:
        print(f"Planted bugs in an autocast target against an fp32 golden (autocast_plants.py), torch "
              f"{torch.__version__}: hits and false alarms, not timings.\n")
        print(table_text(by_config))
    if by_family:
        print(f"\nClean models of other shapes (bf16_negatives.py), bf16 (or fp16) autocast against fp32, "
              f"seeds {', '.join(map(str, negatives.SEEDS))}: a careful verdict is no divergence on every run.\n")
        print(negatives_text(by_family))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**{f"{m} {c}": runs for (m, c), runs in by_config.items()},
                       **{f"negative {fam} {c}": runs for (fam, c), runs in by_family.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("bf16_diagnosis.py", main))

"""Golden harness: every file `msprobe compare` and `msprobe graph_visualize` write, byte for byte,
from two source trees over one set of dumps. A change of structure (not of behaviour) in the diagnosis,
compare or graph code must leave every output file the same.

    python tests/core/diagnosis/golden_outputs.py                     # this tree against git's `main`
    python tests/core/diagnosis/golden_outputs.py --reference b5a061e --work /tmp/goldens

The dumps (made once, with this tree): the planted PyTorch suite (tests/compare/planted.py: every plant,
statistics, md5 and tensor, two steps, two ranks), the bf16-autocast plants (tests/compare/autocast_plants.py,
statistics and tensor), MindSpore twins against their PyTorch originals (tests/compare/ms_pt_twins.py) and
msProbe's own compare tables (tests/core/diagnosis/diagnosis_samples/). Per case the outputs are the result
csv/xlsx, diagnosis.json, the printout (whole, --brief, -tensor_log) with its exit code, the Parquet row
parts of a `--resume` compare (as text), the graph's .html and .vis.db; file names lose their timestamp
and the printout its output folder, and an xlsx is compared member by member, less the time openpyxl
stamps it with.
"""

import argparse
import contextlib
import glob
import gzip
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(os.path.dirname(HERE))
ROOT = os.path.dirname(TESTS)
SAMPLES = os.path.join(HERE, "diagnosis_samples")
_TS = re.compile(r"_\d{14}(_\d+)?")

# (case, target dump, golden dump, extra compare flags); graph for those with a hierarchy (mix)
PLANTED = ("bf16_softmax", "ln_eps", "weight", "bad_backward", "fp16_exp")


def _load(name, path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_dumps(root):
    """The dumps every case reads, under `root`; returns [(case, target, golden, flags, graph)]."""
    sys.path.insert(0, os.path.join(TESTS, "compare"))
    planted = _load("golden_planted", os.path.join(TESTS, "compare", "planted.py"))
    cases = []

    def pt(name, **kw):
        path = os.path.join(root, name)
        if not os.path.isdir(path):
            planted.dump_run(path, **kw)
        return path

    clean = pt("clean-stat", steps=2)
    for plant in (None,) + PLANTED:
        cases.append((f"planted-{plant}", pt(f"{plant}-stat", plant=plant, steps=2), clean, [], True))
    md5 = pt("clean-md5", task="md5")
    cases.append(("md5-weight", pt("weight-md5", plant="weight", task="md5"), md5, [], False))
    tensor = pt("clean-tensor", task="tensor")
    for plant in ("bf16_softmax", "fp16_exp"):
        cases.append((f"tensor-{plant}", pt(f"{plant}-tensor", plant=plant, task="tensor"), tensor, [], True))
    # two ranks of one step: rank 1 holds the plant
    for name, plant1 in (("ranks-golden", None), ("ranks-target", "ln_eps")):
        pt(os.path.join(name, "r0"), rank=0)
        pt(os.path.join(name, "r1"), plant=plant1, rank=1)
        step = os.path.join(root, name, "step0")
        if not os.path.isdir(step):
            os.makedirs(step)
            for r in (0, 1):
                shutil.move(os.path.join(root, name, f"r{r}", "step0", f"rank{r}"), step)
    cases.append(("ranks", os.path.join(root, "ranks-target", "step0"), os.path.join(root, "ranks-golden", "step0"),
                  [], True))
    cases.append(("planted-weight-xlsx", os.path.join(root, "weight-stat"), clean, ["--xlsx"], False))
    cases.append(("planted-ln_eps-log", os.path.join(root, "ln_eps-stat"), clean, ["-tensor_log"], False))
    cases.append(("planted-weight-bf16", os.path.join(root, "weight-stat"), clean, ["--precision", "bfloat16"],
                  False))

    autocast = _load("golden_autocast", os.path.join(ROOT, "tests", "compare", "autocast_plants.py"))
    import torch
    for task in ("statistics", "tensor"):
        golden = os.path.join(root, f"ac-fp32-{task}")
        if not os.path.isdir(golden):
            autocast.dump_run(golden, task=task)
        for plant in (None, sorted(autocast.PLANTS)[0]):
            target = os.path.join(root, f"ac-{plant}-{task}")
            if not os.path.isdir(target):
                autocast.dump_run(target, plant, task=task, autocast=torch.bfloat16)
            cases.append((f"autocast-{plant}-{task}", target, golden, [], task == "statistics"))

    twins = _load("golden_twins", os.path.join(TESTS, "compare", "ms_pt_twins.py"))
    from msprobe.mindspore import PrecisionDebugger as MsDebugger
    from msprobe.pytorch import PrecisionDebugger as PtDebugger
    x, y = twins.make_data("vision")
    for level in ("mix", "L1"):
        pt_dir = os.path.join(root, f"pt-{level}")
        if not os.path.isdir(pt_dir):
            debugger = PtDebugger(dump_path=pt_dir, task="statistics", level=level)
            twins.train_pt("vision", twins.build_pt("vision", twins.build_ms("vision")), x, y, debugger)
            debugger.close()
        for plant in (None, "conv_weight") if level == "mix" else (None,):
            ms_dir = os.path.join(root, f"ms-{level}-{plant}")
            if not os.path.isdir(ms_dir):
                debugger = MsDebugger(dump_path=ms_dir, task="statistics", level=level)
                twins.train_ms("vision", twins.build_ms("vision", plant), x, y, plant, debugger)
                debugger.close()
            cases.append((f"ms-pt-{level}-{plant}", ms_dir, pt_dir, [], level == "mix"))
    return cases


def _cli(argv, out_dir, name):
    """Run `msprobe argv` in this process; its stdout, stderr and exit code into out_dir/name.txt."""
    from msprobe.cli.main import main
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(argv)
    text = f"exit {code}\n--- stdout\n{stdout.getvalue()}--- stderr\n{stderr.getvalue()}"
    with open(os.path.join(out_dir, name + ".txt"), "w", encoding="utf-8") as f:
        f.write(text.replace(out_dir, "<OUT>"))


def write_outputs(cases, out_root):
    """Every output of every case, with the msprobe on sys.path."""
    for case, target, golden, flags, graph in cases:
        out = os.path.join(out_root, case)
        os.makedirs(out)
        base = ["compare", "-tp", target, "-gp", golden, "--no-progress"] + flags
        _cli(base + ["-o", os.path.join(out, "compare")], out, "compare")
        _cli(base + ["--brief", "-o", os.path.join(out, "brief")], out, "brief")
        _parts(target, golden, flags, os.path.join(out, "parts"))
        if graph:
            _cli(["graph_visualize", "-tp", target, "-gp", golden, "-o", os.path.join(out, "graph"),
                  "--no-progress"], out, "graph")
    _diagnose_tables(os.path.join(out_root, "msprobe-tables"))
    for path in glob.glob(os.path.join(out_root, "**", "*"), recursive=True):
        stripped = _TS.sub("", path)
        if stripped != path and os.path.isfile(path):
            os.rename(path, stripped)
        if path.endswith(".txt"):
            with open(stripped, encoding="utf-8") as f:
                text = f.read()
            with open(stripped, "w", encoding="utf-8") as f:
                f.write(_TS.sub("", text))


def _parts(target, golden, flags, out):
    """The Parquet row parts a `--resume` compare writes, each as text (its schema, then its rows): the
    parts' metadata holds a signed pickle that names the output folder, so their bytes differ anyway."""
    import pyarrow.parquet as pq

    from msprobe.core.compare import write_compare
    precision = flags[flags.index("--precision") + 1] if "--precision" in flags else None
    write_compare(target, golden, out, xlsx="--xlsx" in flags, precision=precision, progress=False,
                  keep_tables=False, timestamp="20260101000000", resume=True)
    for path in sorted(glob.glob(os.path.join(out, "rows", "step=*", "rank=*", "part.parquet"))):
        table = pq.read_table(path)
        lines = [str(table.schema.remove_metadata())]
        lines += [repr(row) for row in table.to_pylist()]
        with open(path[:-len(".parquet")] + ".txt", "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    for path in glob.glob(os.path.join(out, "**", "*"), recursive=True):
        if os.path.isfile(path) and not path.endswith("part.txt"):
            os.remove(path)


def _diagnose_tables(out):
    """msProbe's own compare tables, diagnosed as a user's CSVs: diagnosis.json, printout, labelled table."""
    import json

    import pandas as pd

    from msprobe.core.diagnosis import diagnose, format_diagnosis

    os.makedirs(out)
    for path in sorted(glob.glob(os.path.join(SAMPLES, "*.csv.gz"))):
        name = os.path.basename(path)[:-len(".csv.gz")]
        with gzip.open(path, "rt", encoding="utf-8") as f:
            table = pd.read_csv(f)

        class Result:
            pass

        res = Result()
        res.table, res.step, res.rank = table, 0, 0
        d = diagnose([res])
        d = d.to_json() if hasattr(d, "to_json") else d  # typed, or (before it was) the dict itself
        with open(os.path.join(out, name + ".diagnosis.json"), "w", encoding="utf-8") as f:
            json.dump(d, f, indent=1)
        with open(os.path.join(out, name + ".txt"), "w", encoding="utf-8") as f:
            f.write(format_diagnosis(d) + "\n" + format_diagnosis(d, brief=True) + "\n")
        table.to_csv(os.path.join(out, name + ".labelled.csv"), index=False)


def diff_trees(a, b):
    """(files compared, [relative paths that differ or exist on one side only])."""
    def files(root):
        return {os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "**", "*"), recursive=True)
                if os.path.isfile(p)}
    fa, fb = files(a), files(b)
    bad = sorted(fa ^ fb)
    for rel in sorted(fa & fb):
        if _content(os.path.join(a, rel)) != _content(os.path.join(b, rel)):
            bad.append(rel)
    return len(fa | fb), bad


_XLSX_TIME = re.compile(rb"<dcterms:(created|modified)[^>]*>[^<]*</dcterms:\1>")


def _content(path):
    """A file's bytes; an xlsx's as its members' bytes, less the time openpyxl writes it at."""
    if not path.endswith(".xlsx"):
        with open(path, "rb") as f:
            return f.read()
    import zipfile
    with zipfile.ZipFile(path) as z:
        return [(n, _XLSX_TIME.sub(b"", z.read(n))) for n in z.namelist()]


def export(rev, dest):
    """The src/ of git revision `rev` under dest, with this tree's compiled extension."""
    os.makedirs(dest, exist_ok=True)
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "src"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    for so in glob.glob(os.path.join(ROOT, "src", "msprobe", "*.so")):
        shutil.copy(so, os.path.join(dest, "src", "msprobe"))
    return os.path.join(dest, "src")


def run_with(src, dumps, out_root):
    """write_outputs in a fresh interpreter importing msprobe from `src`."""
    env = dict(os.environ, PYTHONPATH=src, MSPROBE_GOLDEN_DUMPS=dumps)
    subprocess.run([sys.executable, __file__, "--write", out_root, "--dumps", dumps], env=env, check=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference", default="main", help="git revision whose outputs are the goldens (main)")
    p.add_argument("--work", help="folder for dumps and outputs (default: a temporary one, removed)")
    p.add_argument("--keep-reference", action="store_true",
                   help="reuse the reference outputs of an earlier run into the same --work")
    p.add_argument("--dumps", help=argparse.SUPPRESS)
    p.add_argument("--write", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.write:  # the child: outputs of the msprobe on PYTHONPATH
        write_outputs(make_dumps(args.dumps), args.write)
        return 0
    work = args.work or tempfile.mkdtemp(prefix="msprobe-goldens-")
    dumps = os.path.join(work, "dumps")
    os.makedirs(dumps, exist_ok=True)
    make_dumps(dumps)
    keep = args.keep_reference and os.path.isdir(os.path.join(work, "reference"))
    for side in ("candidate",) if keep else ("reference", "candidate"):
        shutil.rmtree(os.path.join(work, side), ignore_errors=True)
    if not keep:
        run_with(export(args.reference, os.path.join(work, "reference-src")), dumps, os.path.join(work, "reference"))
    run_with(os.path.join(ROOT, "src"), dumps, os.path.join(work, "candidate"))
    count, bad = diff_trees(os.path.join(work, "reference"), os.path.join(work, "candidate"))
    print(f"{count} output files compared against {args.reference}: {len(bad)} differ")
    for rel in bad:
        print(f"  {rel}")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""`-save_error_data`: what a failing API was fed and what both runs gave, plus a one-API dump and a
script that re-runs the check, under `{out}/error_data/{api}/`.

The one-API `dump.json` is a tensor-mode dump whose records name the saved input files, so
`msprobe acc_check -api_info error_data/{api}/dump.json` replays the very same data too.
Must not import torch or mindspore.
"""

import copy
import json
import os

import numpy as np

from msprobe.core.dump.api_sources import api_sources_of_case, read_api_sources, write_api_sources
from msprobe.core.dump.reader import iter_tensor_records
from msprobe.core.dump.tensor_files import save_npy
from msprobe.core.safe_files import make_dirs, open_text


def save_error_case(root, case, run, framework, script_text, api_sources=None):
    """Write the inputs, outputs, one-API dump.json (with its api_sources.json part) and reproduce.py of a
    failing case.

    Args:
        root: `{out}/error_data`.
        case: the ApiCase; run: its CaseRun; framework: dump.json's framework.
        script_text: the executor's reproduce script for this directory.
        api_sources: the checked dump's api_sources.json, or None.

    Returns:
        The case's directory.
    """
    case_dir = os.path.join(root, case.name)
    data_dir = os.path.join(case_dir, "dump_tensor_data")
    make_dirs(data_dir)
    forward = copy.deepcopy(case.forward)
    backward = copy.deepcopy(case.backward) if case.backward else None
    for key, array in run.inputs.items():
        save_npy(os.path.join(data_dir, f"{case.name}.{key}.npy"), np.ascontiguousarray(array))
    tensors = [(p, r) for p, r in iter_tensor_records([forward.get("input_args", []),
                                                       forward.get("input_kwargs", {})])]
    for path, record in tensors:
        key = "forward.input." + ".".join(str(p) for p in _input_path(path))
        record["data_name"] = f"{case.name}.{key}.npy" if key in run.inputs else record.pop("data_name", None)
        if record["data_name"] is None:
            del record["data_name"]
    if backward:
        for i, (_, record) in enumerate(iter_tensor_records(backward.get("input", []))):
            key = f"backward.input.{i}"
            if key in run.inputs:
                record["data_name"] = f"{case.name}.{key}.npy"
    for compared in list(run.forward) + list(run.backward or ()):
        stem = os.path.join(data_dir, compared.name)
        save_npy(stem + ".tested.npy", np.ascontiguousarray(compared.tested))
        save_npy(stem + ".bench.npy", np.ascontiguousarray(compared.bench))
    data = {f"{case.name}.forward": forward}
    if backward:
        data[f"{case.name}.backward"] = backward
    doc = {"task": "tensor", "level": "L1", "framework": framework, "dump_data_dir": None, "data": data}
    with open_text(os.path.join(case_dir, "dump.json")) as f:
        json.dump(doc, f, indent=1)
    write_api_sources(case_dir, api_sources_of_case(read_api_sources(api_sources), case.prefix, case.api))
    script = os.path.join(case_dir, "reproduce.py")
    with open_text(script) as f:
        f.write(script_text)
    return case_dir


def _input_path(path):
    """iter_tensor_records path over [args, kwargs] -> the tensor file index path (args: i, kwargs: name)."""
    return path[1:]


_SCRIPT = '''"""Reproduce msprobe acc_check of {name} ({framework}): run it on the device under test in the
dumped dtypes and on the CPU in float64 with the inputs saved beside this script, then compare.

    python reproduce.py
"""
import os

from msprobe.core.acc_check.checker import judge
from msprobe.core.acc_check.execution import ExecutorSpec
from msprobe.core.acc_check.input_data import TensorSource, rng_for
from msprobe.core.acc_check.runner import load_dump
from msprobe.core.dump.api_sources import api_sources_path

HERE = os.path.dirname(os.path.abspath(__file__))
reader, cases = load_dump(os.path.join(HERE, "dump.json"))
case = cases[0]
executor = ExecutorSpec({framework!r}, {options!r} + (("api_sources", api_sources_path(HERE)),)).create()
run = executor.run(case, TensorSource(reader), rng_for(case.name, {seed!r}))
result = judge(case, run)
print(f"{{case.name}} on {{executor.device_name}}: forward {{result.forward}}, backward {{result.backward or '-'}}")
for row in result.details:
    print(f"  {{row.api_name}}  {{row.tested_dtype}} vs {{row.bench_dtype}}  cosine={{row.cosine:.8g}}  "
          f"max_abs_err={{row.max_abs_err:.4g}}  max_rel_err={{row.max_rel_err:.4g}}  ULP={{row.ulp_err:.4g}}  "
          f"{{row.status}} / dtype-aware {{row.dtype_status}}")
if result.message:
    print("  " + result.message)
'''


def reproduce_script(spec, case, seed=1234):
    """Text of reproduce.py for a failing case checked with executor `spec` (an ExecutorSpec)."""
    options = tuple((k, v) for k, v in spec.options if k not in ("threads", "api_sources"))
    return _SCRIPT.format(name=case.name, framework=spec.framework, options=options, seed=seed)

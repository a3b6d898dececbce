"""Diagnosis on real dumps: the planted model (tests/compare/planted.py) is trained one step under
PrecisionDebugger once clean (golden) and once per planted single-op divergence (target), in statistics
and in tensor mode; compare_dumps + diagnose must name the planted call first, with the right direction
and evidence, and say "no divergence" for identical runs. Also the CLI contract (--fail-on-divergence,
diagnosis.json) and the README demo's planted bf16 softmax.
"""

import json
import os
import subprocess
import sys

import pytest

from private_modules import load_private

pytest.importorskip("torch")

from msprobe.core.diagnosis import diagnose, format_diagnosis  # noqa: E402
from msprobe.core.compare.engine import compare_dumps  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


planted = load_private("msprobe_test_planted", os.path.join(ROOT, "tests", "compare", "planted.py"))
TASKS = ("statistics", "tensor")


@pytest.fixture(scope="module")
def planted_dumps(tmp_path_factory):
    """{(task, plant): dump path} for every plant and the clean run, at level mix, plus a second
    clean run per task (to check that identical runs agree)."""
    root = tmp_path_factory.mktemp("planted")
    out = {}
    for task in TASKS:
        for plant in (None,) + planted.PLANTS:
            out[(task, plant)] = planted.dump_run(root / task / str(plant), plant, task=task)
        out[(task, "again")] = planted.dump_run(root / task / "again", None, task=task)
    return out


def _diagnose(target, golden):
    d = diagnose(compare_dumps(target, golden, progress=False))
    json.dumps(d.to_json(), allow_nan=False)  # diagnosis.json must be strict JSON
    return d


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("plant", planted.PLANTS)
def test_planted_divergence_is_suspect_one(planted_dumps, task, plant):
    d = _diagnose(planted_dumps[(task, plant)], planted_dumps[(task, None)])
    api, direction, module = planted.EXPECTED[plant]
    assert d["divergence"] is True
    top = d["suspects"][0]
    assert (top["api"], top["direction"]) == (api, direction), format_diagnosis(d)
    if module:
        assert top["module_path"][-1] == module
    assert top["step"] == 0 and top["ranks"] == [0]
    assert d["verdict"].startswith(f"error is introduced in {direction} at {api}")
    assert d["mode"] == task
    first_line = format_diagnosis(d).splitlines()[0]
    assert api in first_line and direction in first_line
    assert top["stack"] and "planted.py" in top["stack"]  # the user's line, not torch's


def _row(rows, suffix):
    """The evidence row whose name ends with `suffix` (a string or a tuple of them)."""
    return next(r for r in rows if r["name"].endswith(suffix))


@pytest.mark.parametrize("task", TASKS)
def test_evidence_of_each_plant(planted_dumps, task):
    golden = planted_dumps[(task, None)]
    # bf16 softmax: the input arrives in bfloat16 from a cast golden does not have.
    top = _diagnose(planted_dumps[(task, "bf16_softmax")], golden)["suspects"][0]
    inp = _row(top["inputs"], ".input.0")
    assert top["kind"] == "foreign_input" and inp["flags"] == ["dtype"]
    assert (inp["target_dtype"], inp["golden_dtype"]) == ("torch.bfloat16", "torch.float32")
    assert "Tensor.bfloat16.0.forward" in inp["origin"]
    if task == "tensor":  # msProbe's own tensor metrics come along as evidence
        m = _row(top["outputs"], ".output.0")["tensor_metrics"]
        assert 0.99 < m["Cosine"] < 1.0 and m["One Thousandth Err Ratio"] < 1.0
    # wrong epsilon: a scalar argument changed; the LayerNorm module is context, not a second suspect.
    d = _diagnose(planted_dumps[(task, "ln_eps")], golden)
    top = d["suspects"][0]
    eps = _row(top["inputs"], (".input.eps", ".input.4"))  # by name or position
    assert top["kind"] == "argument" and eps["flags"] == ["argument"]
    assert eps["target"]["max"] == pytest.approx(0.1) and eps["golden"]["max"] == pytest.approx(1e-5)
    assert "Module.ln.LayerNorm.forward.0" in top["also_explains"]
    assert all(s["api"] != "Module.ln.LayerNorm.forward.0" for s in d["suspects"])
    # perturbed weight: the parameter is named; outputs differ much less than the weight.
    top = _diagnose(planted_dumps[(task, "weight")], golden)["suspects"][0]
    assert top["kind"] == "parameter"
    assert _row(top["inputs"], ".input.1")["origin"] == "parameter 'weight' of Module.fc2.Linear"
    assert _row(top["inputs"], ".input.0")["diverges"] is False  # the activation coming in matches
    # wrong backward: nothing diverges in forward; the module's own backward has matching gradient in.
    d = _diagnose(planted_dumps[(task, "bad_backward")], golden)
    assert all(s["direction"] == "backward" for s in d["suspects"])
    top = d["suspects"][0]
    assert top["kind"] == "introduced" and top["input_error"] == 0.0
    assert top["output_error"] == pytest.approx(0.5, rel=1e-3)  # the planted factor 1.5
    # overflow: finite inputs, inf out; golden finite.
    top = _diagnose(planted_dumps[(task, "fp16_exp")], golden)["suspects"][0]
    out = _row(top["outputs"], ".output.0")
    assert top["kind"] == "overflow" and "nonfinite" in out["flags"] and out["target"]["max"] == "inf"


@pytest.mark.parametrize("task", TASKS)
def test_the_perturbed_parameter_row_says_introduces(planted_dumps, task):
    """The module record lists the perturbed weight again after the linear inside it: there too the
    Diagnosis column (and so the graph viewer) says the error enters, not that it is carried."""
    results = compare_dumps(planted_dumps[(task, "weight")], planted_dumps[(task, None)], progress=False)
    diagnose(results)
    labels = results[0].table.set_index("NPU Name")["Diagnosis"]
    assert labels["Functional.linear.1.forward.input.1"] == "introduces"
    assert labels["Module.fc2.Linear.forward.0.parameters.weight"] == "introduces"
    assert labels["Module.fc2.Linear.forward.0.parameters.bias"] == "agrees"
    assert labels["Module.fc2.Linear.backward.0.output.0"] == "inherits"


@pytest.mark.parametrize("plant", planted.PLANTS)
def test_md5_mode_names_the_planted_call_from_checksums_alone(tmp_path_factory, plant):
    """md5 tables carry no statistics: a call is suspect when its input checksums match and its
    output checksums do not (or a dtype differs)."""
    root = tmp_path_factory.getbasetemp() / "md5"
    root.mkdir(exist_ok=True)
    golden = root / "golden"
    if not golden.exists():
        planted.dump_run(golden, None, task="md5")
    target = planted.dump_run(root / plant, plant, task="md5")
    d = _diagnose(target, str(golden))
    assert d["mode"] == "md5" and d["divergence"] is True
    api, direction, _ = planted.EXPECTED[plant]
    assert (d["suspects"][0]["api"], d["suspects"][0]["direction"]) == (api, direction)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("plants", ["bf16_softmax+weight", "fp16_exp+bad_backward", "ln_eps+bad_backward"])
def test_two_plants_are_both_named_in_execution_order(planted_dumps, tmp_path, task, plants):
    """A later fault is not hidden by an earlier one: the perturbed weight is a parameter, not a value
    computed from the bf16 softmax; the wrong backward amplifies far beyond what its forward carried."""
    target = planted.dump_run(tmp_path / "t", plants, task=task)
    d = _diagnose(target, planted_dumps[(task, None)])
    named = [(s["api"], s["direction"]) for s in d["suspects"]]
    assert named == [planted.EXPECTED[p][:2] for p in plants.split("+")], format_diagnosis(d)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("plant", [None, "bf16_softmax", "weight"])
def test_noise_below_the_fp32_floor_is_no_divergence_and_hides_no_plant(planted_dumps, tmp_path, task, plant):
    """Target inputs jittered by 1e-6 (relative), as two devices' kernels would: every value downstream
    differs a little, yet nothing is a suspect but the plant."""
    target = planted.dump_run(tmp_path / "t", plant, task=task, input_noise=1e-6)
    results = compare_dumps(target, planted_dumps[(task, None)], progress=False)
    table = results[0].table
    assert (table["NPU l2norm"] != table["Bench l2norm"]).sum() > 20  # the jitter reaches most values
    d = diagnose(results)
    if plant is None:
        assert d["divergence"] is False, format_diagnosis(d)
    else:
        assert [s["api"] for s in d["suspects"]] == [planted.EXPECTED[plant][0]], format_diagnosis(d)


def test_noise_at_the_floor_is_listed_as_marginal_not_a_divergence(planted_dumps, tmp_path):
    """Jitter of 1e-5 lands just past float32's floor: listed (weak), but no divergence for CI."""
    target = planted.dump_run(tmp_path / "t", None, input_noise=1e-5)
    d = _diagnose(target, planted_dumps[("statistics", None)])
    assert d["divergence"] is False and d["suspects"]
    assert {s["tier"] for s in d["suspects"]} == {"weak"}
    assert d["suspects"][0]["api"] == "Functional.linear.0.forward"  # the jittered model input
    assert d["verdict"].startswith("no divergence beyond noise")
    assert format_diagnosis(d).startswith("Diagnosis: no divergence beyond noise")


@pytest.mark.parametrize("task", TASKS)
def test_identical_runs_say_no_divergence(planted_dumps, task):
    d = _diagnose(planted_dumps[(task, "again")], planted_dumps[(task, None)])
    assert d["divergence"] is False and d["suspects"] == []
    assert d["verdict"].startswith("no divergence")
    assert d["ranks"][0]["compared_rows"] > 50 and d["ranks"][0]["diverging_rows"] == 0
    assert format_diagnosis(d).startswith("Diagnosis: no divergence")


def test_module_level_dump_names_the_module(tmp_path):
    """At L0 there are no APIs: the LayerNorm module itself is where error enters."""
    golden = planted.dump_run(tmp_path / "g", None, level="L0")
    target = planted.dump_run(tmp_path / "t", "ln_eps", level="L0")
    top = _diagnose(target, golden)["suspects"][0]
    assert (top["api"], top["kind"], top["direction"]) == ("Module.ln.LayerNorm.forward.0", "introduced", "forward")


def test_api_level_dump_names_the_linear_reading_the_weight(tmp_path):
    """At L1 there are no parameter records: the linear whose weight argument differs first is named, and
    the argument's slot says it holds a parameter."""
    golden = planted.dump_run(tmp_path / "g", None, level="L1")
    target = planted.dump_run(tmp_path / "t", "weight", level="L1")
    top = _diagnose(target, golden)["suspects"][0]
    assert (top["api"], top["kind"]) == ("Functional.linear.1.forward", "parameter")
    assert _row(top["inputs"], ".input.1")["origin"] == "the weight argument of Functional.linear (a parameter)"
    assert top["module_path"] == []


@pytest.mark.parametrize("plant", ["weight", "bad_backward"])
def test_output_only_dumps_name_the_first_diverging_call_only(tmp_path, plant):
    """data_mode ["output"]: no inputs to compare, so the first call whose output diverges is named
    and the calls after it, whose inputs were not dumped, are not suspects of their own."""
    golden = planted.dump_run(tmp_path / "g", None, data_mode=["output"])
    target = planted.dump_run(tmp_path / "t", plant, data_mode=["output"])
    d = _diagnose(target, golden)
    api, direction, _ = planted.EXPECTED[plant]
    assert [(s["api"], s["direction"]) for s in d["suspects"]] == [(api, direction)]
    assert d["suspects"][0]["inputs"] == []


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_api_level_dump_names_a_custom_functions_wrong_backward(tmp_path, compiled):
    """At L1 no module record holds the custom Function: it is recorded as API Function.SwishFn, and its
    backward record (matching gradient in, 1.5x gradient out) is where error enters. Compiled, Dynamo
    never calls apply(): the Function's traced forward and backward make the same records."""
    import torch
    wrap = (lambda m: torch.compile(m, backend="aot_eager")) if compiled else None  # noqa: E731
    golden = planted.dump_run(tmp_path / "g", None, level="L1", wrap=wrap)
    torch._dynamo.reset()
    target = planted.dump_run(tmp_path / "t", "bad_backward", level="L1", wrap=wrap)
    torch._dynamo.reset()
    d = _diagnose(target, golden)
    top = d["suspects"][0]
    assert (top["api"], top["kind"], top["direction"]) == ("Function.SwishFn.0.backward", "introduced", "backward")
    assert top["input_error"] == 0.0 and top["output_error"] == pytest.approx(0.5, rel=1e-3)
    assert "planted.py" in top["stack"] and "SwishFn.apply" in top["stack"]
    # the inner ops of its forward and backward are folded into its records, as for any API
    keys = list(json.loads((tmp_path / "t" / "step0" / "rank0" / "dump.json").read_text())["data"])
    assert "Function.SwishFn.0.forward" in keys and "Torch.sigmoid.1.forward" not in keys  # (.0: the gate's)
    assert not any(k.startswith("Tensor.__rsub__.") for k in keys)  # `1 - s`: its backward's


def test_torchs_own_autograd_functions_are_not_recorded_as_apis(tmp_path):
    """torch.utils.checkpoint's reentrant CheckpointFunction is plumbing: the calls inside it are the record."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from msprobe.pytorch import PrecisionDebugger
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    try:
        debugger.start(lin, rank_id=0)
        checkpoint(lambda v: torch.tanh(lin(v)), x, use_reentrant=True).sum().backward()
        debugger.stop()
        debugger.step()
    finally:
        debugger.close()
    from torch.autograd.function import Function
    assert not hasattr(Function.__dict__["apply"].__func__, "__msprobe_original__")  # restored at stop()
    keys = list(json.loads((tmp_path / "step0" / "rank0" / "dump.json").read_text())["data"])
    assert "Functional.linear.0.forward" in keys and "Torch.tanh.0.forward" in keys
    assert not any(k.startswith("Function.") for k in keys)


def test_later_steps_do_not_repeat_carried_parameters(tmp_path):
    """Step 1 starts from parameters step 0 already moved apart: they are not new suspects."""
    golden = planted.dump_run(tmp_path / "g", None, steps=2)
    target = planted.dump_run(tmp_path / "t", "weight", steps=2)
    d = _diagnose(target, golden)
    assert sorted(r["step"] for r in d["ranks"]) == [0, 1]
    assert d["suspects"][0]["step"] == 0 and d["suspects"][0]["api"] == "Functional.linear.1.forward"
    assert len({(s["api"], s["kind"]) for s in d["suspects"]}) == len(d["suspects"])  # one entry per call
    assert not [s for s in d["suspects"] if s["step"] == 1 and s["kind"] in ("parameter", "input")]
    assert {r["step"]: r["diverging_calls"] > 0 for r in d["ranks"]} == {0: True, 1: True}


def _msprobe(*args):
    return subprocess.run([sys.executable, "-m", "msprobe.cli.main", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_writes_diagnosis_and_fails_on_divergence(planted_dumps, tmp_path):
    target, golden = planted_dumps[("statistics", "bad_backward")], planted_dumps[("statistics", None)]
    out = tmp_path / "out"
    proc = _msprobe("compare", "-tp", target, "-gp", golden, "-o", str(out), "--no-progress",
                    "--fail-on-divergence")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Module.act.Swish.backward.0" in proc.stdout
    with open(out / "diagnosis.json", encoding="utf-8") as f:
        d = json.load(f)
    assert d["divergence"] is True and d["suspects"][0]["api"] == "Module.act.Swish.backward.0"

    same = _msprobe("compare", "-tp", planted_dumps[("statistics", "again")], "-gp", golden, "-o", str(tmp_path / "o2"),
                    "--no-progress", "--fail-on-divergence")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "no divergence" in same.stdout


def test_readme_demo_names_the_planted_softmax(tmp_path):
    """examples/demo.py: fp32 vs the same model with block 1's softmax in bfloat16."""
    demo = load_private("msprobe_example_demo", os.path.join(ROOT, "examples", "demo.py"))
    demo.train_one_step(str(tmp_path / "fp32"), planted=False)
    demo.train_one_step(str(tmp_path / "planted"), planted=True)
    d = _diagnose(str(tmp_path / "planted"), str(tmp_path / "fp32"))
    top = d["suspects"][0]
    assert top["api"] == "Functional.softmax.1.forward" and top["direction"] == "forward"
    assert top["module_path"] == ["Module.blocks.1.Block.forward.0"]
    assert len(d["suspects"]) == 1  # everything after it only propagates


def test_structure_dumps_have_nothing_to_diagnose(tmp_path):
    golden = planted.dump_run(tmp_path / "g", None, task="structure")
    target = planted.dump_run(tmp_path / "t", "ln_eps", task="structure")
    d = _diagnose(target, golden)
    assert d["mode"] == "structure" and d["divergence"] is False and d["suspects"] == []
    assert d["verdict"] == "nothing to diagnose: structure dumps hold no values"


def test_stack_line_from_stack_json_when_the_table_has_none(planted_dumps):
    results = compare_dumps(planted_dumps[("statistics", "ln_eps")], planted_dumps[("statistics", None)],
                            progress=False, stack=False)
    assert "NPU_Stack_Info" not in results[0].table.columns
    top = diagnose(results)["suspects"][0]
    assert top["api"] == "Functional.layer_norm.0.forward"
    assert "planted.py" in top["stack"] and "self.ln(" in top["stack"]

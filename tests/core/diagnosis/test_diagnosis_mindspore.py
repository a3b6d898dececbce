"""Diagnosis on MindSpore dumps (Cell keys, MindSpore dtype names, primitive APIs): the mint MLP of
tests/mindspore/models.py trained one step, clean and with one perturbed weight in fc2."""

import json
import os

import pytest

from private_modules import load_private

ms = pytest.importorskip("mindspore")

from msprobe.core.diagnosis import diagnose  # noqa: E402
from msprobe.core.compare.engine import compare_dumps  # noqa: E402

MODELS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "mindspore",
                      "models.py")


def _models():
    return load_private("msprobe_test_ms_models_diag", MODELS)


def _dump(path, perturb):
    from msprobe.mindspore import PrecisionDebugger
    models = _models()
    net = models.build("mlp")
    if perturb:
        w = net.fc2.weight
        a = w.asnumpy().copy()
        a[1, 3] += 0.05 * (a.max() - a.min())
        w.set_data(ms.Tensor(a))
    x, y = models.make_data("mlp")
    debugger = PrecisionDebugger(dump_path=str(path), task="statistics", level="mix")
    models.train(net, x, y, steps=1, debugger=debugger)
    debugger.close()
    return str(path)


@pytest.fixture(scope="module")
def ms_dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("ms_diag")
    return {name: _dump(root / name, perturb) for name, perturb in
            (("golden", False), ("again", False), ("perturbed", True))}


def test_mindspore_perturbed_weight_is_named(ms_dumps):
    d = diagnose(compare_dumps(ms_dumps["perturbed"], ms_dumps["golden"], progress=False))
    json.dumps(d.to_json(), allow_nan=False)
    top = d["suspects"][0]
    assert top["kind"] == "parameter" and top["direction"] == "forward"
    assert top["module_path"][-1] == "Cell.fc2.Linear.forward.0"
    weight = next(r for r in top["inputs"] if r.get("origin"))
    assert weight["origin"] == "parameter 'weight' of Cell.fc2.Linear"
    assert weight["target_dtype"] == "Float32"
    assert top["stack"] and "models.py" in top["stack"]  # the model's line, not MindSpore's
    assert len(d["suspects"]) == 1


def test_mindspore_identical_runs_agree(ms_dumps):
    d = diagnose(compare_dumps(ms_dumps["again"], ms_dumps["golden"], progress=False))
    assert d["divergence"] is False and d["verdict"].startswith("no divergence")

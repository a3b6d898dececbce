"""Data-parallel runs against one process with the whole batch: real gloo ranks (tests/compare/dp_worker.py)
train the same MLP under DDP, FSDP2 and a plain all-reduce of the gradients, each rank on its part of the
batch; merged into one run, each agrees with the single process (the ranks' mean losses averaged, their
activation gradients scaled by their share), and a note says what the merge assumed. A weight that only
one rank perturbed is still found.
"""

import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from gloo_ranks import run_ranks  # noqa: E402
from msprobe.core.compare.engine import compare_dumps  # noqa: E402
from msprobe.core.diagnosis import diagnose, format_diagnosis  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dp_worker.py")
SETUPS = ("ddp", "fsdp", "allreduce")


@pytest.fixture(scope="module")
def halves(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp_halves")
    run_ranks(WORKER, 2, [root, ",".join(SETUPS + ("planted",)), "4,4"])
    return root


@pytest.mark.parametrize("setup", SETUPS)
def test_data_parallel_against_the_whole_batch_is_no_divergence(halves, setup):
    results = compare_dumps(str(halves / setup), str(halves / "single"), progress=False)
    d = diagnose(results)
    assert d["divergence"] is False and d["suspects"] == [], format_diagnosis(d)
    note = d["ranks"][0]["merge_note"]
    assert note.startswith("data-parallel merge: the ranks hold 4, 4 of the batch's 8 rows")
    assert "Ranks merged (step 0 rank 0): data-parallel merge" in format_diagnosis(d)
    # the loss: each rank's mean over its half, merged into the whole batch's mean
    table = results[0].table.set_index("NPU Name")
    loss = table.loc["Functional.mse_loss.0.forward.output.0"]
    assert float(loss["NPU mean"]) == pytest.approx(float(loss["Bench mean"]), rel=1e-5)
    grad = table.loc["Functional.mse_loss.0.backward.output.0"]  # scaled by the world size
    assert float(grad["NPU l2norm"]) == pytest.approx(float(grad["Bench l2norm"]), rel=1e-5)


def test_a_weight_one_rank_perturbed_is_still_found(halves):
    d = diagnose(compare_dumps(str(halves / "planted"), str(halves / "single"), progress=False))
    assert d["divergence"] is True, format_diagnosis(d)
    assert d["suspects"][0]["api"] == "Functional.linear.0.forward"


def test_unequal_parts_weigh_the_losses_and_say_what_differs_by_design(tmp_path):
    """5 and 3 rows: the loss is the weighted mean; the update from equally averaged gradients is no
    divergence."""
    run_ranks(WORKER, 2, [tmp_path, "allreduce", "5,3"])
    results = compare_dumps(str(tmp_path / "allreduce"), str(tmp_path / "single"), progress=False)
    d = diagnose(results)
    table = results[0].table.set_index("NPU Name")
    loss = table.loc["Functional.mse_loss.0.forward.output.0"]
    assert float(loss["NPU mean"]) == pytest.approx(float(loss["Bench mean"]), rel=1e-5)
    assert table.loc["Functional.linear.0.backward.output.1", "Diagnosis"] in ("agrees", "rounding")
    assert "the parts are unequal" in d["ranks"][0]["merge_note"]
    assert d["divergence"] is False, format_diagnosis(d)  # the optimizer reads equally averaged gradients
    assert all("unequal parts" in s["reason"] for s in d["suspects"])


def test_tensor_mode_assembles_the_averaged_and_scaled_tensors(tmp_path):
    """Tensor mode: the merged tensors are written from the ranks' files (weighted mean of the local weight
    gradients, scaled activation gradients) and their metrics agree with the single process."""
    run_ranks(WORKER, 2, [tmp_path, "allreduce", "4,4", "tensor"])
    results = compare_dumps(str(tmp_path / "allreduce"), str(tmp_path / "single"), progress=False)
    d = diagnose(results)
    assert d["mode"] == "tensor" and d["divergence"] is False, format_diagnosis(d)
    table = results[0].table.set_index("NPU Name")
    assert float(table.loc["Functional.mse_loss.0.backward.output.0", "Cosine"]) > 0.99999
    assert float(table.loc["Functional.linear.0.backward.output.1", "MaxAbsErr"]) < 1e-6


def test_fsdp2_and_ddp_in_tensor_mode_against_one_process(tmp_path):
    """Tensor mode writes a tensor from its own memory without marking its storage non-resizable: FSDP2
    frees each unsharded parameter after forward with storage.resize_(0), which had raised. DDP's model
    is named as the single process names it (no `Module.module.`), so its module records pair too."""
    run_ranks(WORKER, 2, [tmp_path, "fsdp,ddp", "4,4", "tensor"])
    for setup in ("fsdp", "ddp"):
        results = compare_dumps(str(tmp_path / setup), str(tmp_path / "single"), progress=False)
        d = diagnose(results)
        assert d["mode"] == "tensor" and d["divergence"] is False, format_diagnosis(d)
        table = results[0].table.set_index("NPU Name")
        assert not any(n.startswith("Module.module.") for n in table.index)
        assert table.loc["Module.up.Linear.forward.0.output.0", "Bench Name"] == "Module.up.Linear.forward.0.output.0"
        assert float(table.loc["Module.up.Linear.forward.0.output.0", "Cosine"]) > 0.99999

"""Real multi-process training under tensor parallelism, FSDP2 and DDP (gloo, 2 and 4 processes; the
ranks are tests/pytorch/sharded_worker.py): DTensor values are summarised from their local shard with
the placement in the record, the run's numbers are unchanged by the dump, a sharded run compared with
the single-process run merges its shards and agrees, a planted bug in one shard or one rank is named.
"""

import json
import os

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from gloo_ranks import run_ranks  # noqa: E402
import msprobe_test_models as models  # noqa: E402  (loaded by conftest.py)
from msprobe.core.diagnosis import diagnose  # noqa: E402
from msprobe.core.compare.engine import compare_dumps  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sharded_worker.py")


def _run(root, world, setups):
    outs = run_ranks(WORKER, world, [root, ",".join(setups)])
    return [json.loads(next(line[7:] for line in o.splitlines() if line.startswith("RESULT "))) for o in outs]


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded2")
    return root, _run(root, 2, ["tp", "tp_planted", "tp_compiled", "fsdp", "fsdp_compiled", "ddp", "ddp_compiled"])


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded4")
    return root, _run(root, 4, ["fsdp", "ddp"])


@pytest.fixture(scope="module")
def two_on_device_path(tmp_path_factory):
    """FSDP2 on 2 ranks with the accelerator's summaries (deferred and read in batches): FSDP2 frees each
    module's gathered parameters once it has run, under the API records still waiting for them."""
    root = tmp_path_factory.mktemp("sharded2_device")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MSPROBE_DEVICE_SUMMARY", "1")
        return root, _run(root, 2, ["fsdp"])


def _records(root, setup, rank, step=0):
    with open(root / setup / f"step{step}" / f"rank{rank}" / "dump.json") as f:
        return json.load(f)["data"]


def _diagnosis(target, golden):
    results = compare_dumps(str(target), str(golden), progress=False)
    return results, diagnose(results)


@pytest.mark.parametrize("world", [2, 4])
def test_dump_leaves_every_setup_numbers_unchanged(world, two, four):
    _, results = two if world == 2 else four
    for rank_result in results:
        for setup, losses in rank_result.items():
            assert losses["dumped"] == losses["plain"], setup


def test_tensor_parallel_records_say_which_shard(two):
    root, _ = two
    for rank in (0, 1):
        linear = _records(root, "tp", rank)["Functional.linear.0.forward"]
        x, weight, bias = linear["input_args"]
        assert x["shard"]["placements"] == ["Replicate"]
        # ColwiseParallel: up.weight [32, 16] split by rows, each rank's statistics of its own 16 rows
        assert weight["shape"] == [32, 16] and weight["requires_grad"] is True
        assert weight["shard"] == {"placements": ["Shard(0)"], "mesh": [0, 1], "coordinate": [rank],
                                   "local_shape": [16, 16], "offset": [16 * rank, 0]}
        assert bias["shard"]["offset"] == [16 * rank]
        out = linear["output"][0]
        assert out["shape"] == [4, 32] and out["shard"]["placements"] == ["Shard(1)"]
        # RowwiseParallel's output is a Partial sum until it is reduced: no statistics of the whole
        assert _records(root, "tp", rank)["Functional.linear.1.forward"]["output"][0]["shard"]["placements"] \
            == ["Partial(sum)"]


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_parameters_are_shards_and_nothing_extra_is_recorded(world, two, four):
    root, _ = two if world == 2 else four
    data = _records(root, "fsdp", world - 1)
    # the optimizer updates the sharded parameters: each rank's rows of up.weight [32, 16]
    update = data["Tensor.add_.0.forward"]["input_args"][0]
    rows = 32 // world
    assert update["shard"]["placements"] == ["Shard(0)"]
    assert update["shard"]["local_shape"] == [rows, 16] and update["shard"]["offset"] == [rows * (world - 1), 0]
    # FSDP2's own copies in and out of its buffers are not the model's calls; its collectives are recorded,
    # their output buffers without statistics of uninitialised memory
    assert not any(k.startswith(("Tensor.view", "Tensor.view_as", "Torch.split")) for k in data), list(data)
    gathers = [v for k, v in data.items() if k.startswith("Distributed.all_gather")]
    assert gathers and all(g["input_args"][0]["Max"] is None for g in gathers)
    # module keys are the model's own class names, not fully_shard's FSDPLinear
    assert "Module.up.Linear.forward.0" in data


def test_fsdp2_on_the_device_path_records_what_the_host_path_records(two, two_on_device_path):
    """The summaries waiting for a batch are read before FSDP2 frees the gathered parameters (a crash,
    or numbers of freed memory, before): every record on both ranks and steps is the host path's."""
    host_root, host_losses = two
    device_root, device_losses = two_on_device_path
    for rank in (0, 1):
        assert device_losses[rank]["fsdp"] == host_losses[rank]["fsdp"]
        for step in (0, 1):
            assert not (device_root / "fsdp" / f"step{step}" / f"rank{rank}" / "dump_error_info.log").exists()
            host = models.record_leaves(_records(host_root, "fsdp", rank, step))
            assert any(k.endswith("].Max") for k in host)
            models.assert_same_leaves(host, models.record_leaves(_records(device_root, "fsdp", rank, step)))


def _unchanged_by_the_dump(run, setup):
    """Each rank's first dumped step of `setup`, once its losses are checked equal to the plain run's."""
    root, results = run
    for rank, result in enumerate(results):
        assert result[setup]["dumped"] == result[setup]["plain"], (setup, rank)
        yield _records(root, setup, rank)


def test_tensor_parallel_under_torch_compile_trains_as_without_the_dump(two):
    """A tensor-parallel model compiled, at mix: its DTensor values are recorded by their type (the compiled
    graph's record op takes plain tensors: the step failed to compile), the plain tensors between them with
    their statistics."""
    for data in _unchanged_by_the_dump(two, "tp_compiled"):
        linear = data["Functional.linear.0.forward"]
        assert [v["type"] for v in linear["input_args"]] == ["torch.distributed.tensor.DTensor"] * 3
        assert "Max" not in linear["input_args"][1]
        assert data["Torch.relu.0.forward"]["input_args"][0]["Max"] is not None


def test_ddp_under_torch_compile_trains_as_without_the_dump_and_records_the_model(two):
    """torch.compile(DistributedDataParallel(model)) at mix: the model's modules and calls are recorded inside
    the compiled graphs, named as in one process (no `module.`), and training is unchanged."""
    for data in _unchanged_by_the_dump(two, "ddp_compiled"):
        up = data["Module.up.Linear.forward.0"]
        assert up["output"][0]["shape"] == [4, 32] and up["output"][0]["Max"] is not None
        assert up["parameters"]["weight"]["shape"] == [32, 16]
        assert "Functional.linear.0.forward" in data and any(k.endswith(".backward.0") for k in data)


def test_fsdp2_of_a_compiled_module_trains_as_without_the_dump_and_records_its_calls(two):
    """A module compiled, then sharded by FSDP2, at mix: its parameters are DTensor shards, which the compiled
    graph's record op cannot take with plain tensors (the step failed to compile); the record leaves them out
    (start() says so) and keeps the module's inputs, outputs and API calls."""
    for data in _unchanged_by_the_dump(two, "fsdp_compiled"):
        up = data["Module.up.Linear.forward.0"]
        assert up["input_args"][0]["shape"] == [4, 16] and up["output"][0]["Max"] is not None
        assert "parameters" not in up or not up["parameters"]
        assert "Module.down.Linear.forward.0" in data and "parameters" in data["Module.down.Linear.forward.0"]


@pytest.mark.parametrize("setup", ["tp", "fsdp"])
def test_sharded_run_against_single_process_has_no_divergence(setup, two):
    root, _ = two
    results, d = _diagnosis(root / setup, root / "single")
    assert [r.merged_ranks for r in results] == [2, 2]  # two steps, each rank pair merged into one side
    assert d["divergence"] is False, d["verdict"]
    table = results[0].table
    row = table[table["NPU Name"] == "Functional.linear.0.forward.input.1"].iloc[0]
    assert row["NPU Tensor Shape"] == row["Bench Tensor Shape"] == "[32, 16]" and row["Result"] == "pass"


def test_four_way_fsdp2_against_single_process_has_no_divergence(four):
    root, _ = four
    _, d = _diagnosis(root / "fsdp", root / "single")
    assert d["divergence"] is False, d["verdict"]


def test_planted_bug_in_one_tensor_parallel_shard_is_named(two):
    root, _ = two
    _, d = _diagnosis(root / "tp_planted", root / "single")
    top = d["suspects"][0]
    assert d["divergence"] is True
    assert top["api"] == "Functional.linear.0.forward" and top["kind"] == "parameter"
    assert "Module.up.Linear" in d["verdict"] or "Module.up.Linear" in json.dumps(top)


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_rank_local_bug_names_its_rank_and_who_receives_it(world, two, four):
    root, _ = two if world == 2 else four
    results, d = _diagnosis(root / "ddp_target", root / "ddp")
    assert sorted({r.rank for r in results}) == list(range(world))  # rank by rank, no merge
    top = d["suspects"][0]
    assert (top["api"], top["ranks"]) == ("Tensor.__mul__.0.forward", [world - 1])
    received = [s for s in d["suspects"] if s["ranks"] != [world - 1]]
    assert received and all(s["kind"] == "communication" and s["api"].startswith("Distributed.all_reduce")
                            for s in received)
    assert sorted(r for s in received for r in s["ranks"]) == list(range(world - 1))

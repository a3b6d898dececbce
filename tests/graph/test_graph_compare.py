"""Compare results merged into the hierarchy: node colours follow the compare table's Result column,
layer mapping matches renamed layers, golden-only nodes appear where they belong, compare.json works."""

import glob
import json
import os
import re
import subprocess
import sys

import pytest

import graph_dumps
from graph_db import read_graph_db
from msprobe.core.compare.engine import compare_dumps
from msprobe.core.graph.build import visualize
from msprobe.core.graph.merge import UNMATCHED

SEVERITY = {"none": 0, "pass": 1, "unmatched": 2, "warning": 3, "error": 4}


def call_of(tensor_name):
    m = re.match(r"^(.*\.parameters_grad\.\d+)\..*$", tensor_name)
    return m.group(1) if m else re.sub(r"\.(input|output|parameters)\..*$", "", tensor_name)


def row_verdict(result, bench):
    if bench == "N/A":
        return "unmatched"
    return result if result in ("pass", "warning", "error") else "none"


def test_node_colour_is_the_worst_result_of_its_rows(transformer_dumps, tmp_path):
    golden, target = transformer_dumps
    (res,) = compare_dumps(target, golden, progress=False)
    expected = {}
    for name, bench, result in zip(res.table["NPU Name"], res.table["Bench Name"], res.table["Result"]):
        v = row_verdict(result, bench)
        node = call_of(name)
        if SEVERITY[v] > SEVERITY[expected.get(node, "none")]:
            expected[node] = v
    out = visualize(target, str(tmp_path), golden_path=golden, progress=False)
    (g,) = read_graph_db(out.db_path)["graphs"]
    got = dict(zip(g["names"], g["verdict"]))
    for node, v in expected.items():
        assert got[node] == v, node
    assert {"pass", "warning", "error", "unmatched"} <= set(got.values())
    assert got["Tensor.__mul__.1.forward"] == "error" and got["Torch.clamp.0.forward"] == "unmatched"
    # every tensor row of the table is in the database, with its numbers
    assert len(g["tensors"]) == len(res.table)
    by_name = {t["NPU Name"]: t for t in g["tensors"]}
    for _, row in res.table.iterrows():
        t = by_name[row["NPU Name"]]
        assert t["Result"] == row["Result"]
        if isinstance(row["NPU max"], float):
            assert t["NPU max"] == pytest.approx(row["NPU max"], nan_ok=True)
    assert out.document["graphs"][0]["suspects"][0]["name"] == "Tensor.__mul__.1.forward"


@pytest.fixture(scope="module")
def renamed(tmp_path_factory):
    root = tmp_path_factory.mktemp("renamed")
    golden = graph_dumps.dump_transformer(root / "golden", layers=2)
    target = graph_dumps.dump_transformer(root / "target", layers=2, up_name="up")
    mapping = root / "layer_mapping.yaml"
    mapping.write_text("Block:\n  up: fc1\n")
    return golden, target, str(mapping)


def test_layer_mapping_matches_renamed_layers(renamed, tmp_path):
    golden, target, mapping = renamed
    plain = visualize(target, str(tmp_path / "plain"), golden_path=golden, progress=False).document["graphs"][0]
    mapped = visualize(target, str(tmp_path / "mapped"), golden_path=golden, layer_mapping=mapping,
                       progress=False).document["graphs"][0]
    names = plain["names"]
    up_nodes = [i for i, n in enumerate(names) if ".up.Linear." in n]
    assert up_nodes
    # without the mapping the renamed modules' own tensors find no golden partner ...
    assert all(plain["verdict"][i] == UNMATCHED and plain["match"][i] is None
               for i in up_nodes if ".parameters_grad." not in names[i])
    # ... and the golden's fc1 modules have no target partner: shown as golden-only nodes, inside the
    # target block that matches their golden parent (or inside another golden-only node)
    golden_only = [i for i, side in enumerate(plain["side"]) if side == 1]
    # (and the optimizer's updates of their parameters, Optimizer.SGD.blocks.N.fc1.weight)
    updates = [i for i in golden_only if names[i].startswith("Optimizer.")]
    assert updates and all(".fc1." in names[i] for i in updates)
    golden_only = [i for i in golden_only if i not in updates]
    assert golden_only and all(".fc1.Linear." in names[i] for i in golden_only)
    for i in golden_only:
        parent = plain["parent"][i]
        assert plain["side"][parent] == 1 or ".Block." in names[parent], names[i]
    assert "Module.blocks.1.fc1.Linear.forward.0" in [names[i] for i in golden_only]
    # the APIs inside are matched by name and shown once, under the target's renamed module
    assert names.count("Functional.linear.6.forward") == 1
    # with it, every renamed node is matched to its fc1 counterpart and nothing is unmatched
    assert UNMATCHED not in mapped["verdict"] and 1 not in mapped["side"]
    for i, n in enumerate(mapped["names"]):
        if ".up.Linear." in n:
            assert mapped["match"][i] == n.replace(".up.", ".fc1."), n


def test_cli_layer_mapping_flag(renamed, tmp_path):
    golden, target, mapping = renamed
    res = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "graph_visualize", "-tp", target, "-gp", golden,
                          "-lm", mapping, "-fm", "-o", str(tmp_path), "--no-progress"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    (db,) = glob.glob(str(tmp_path / "*.vis.db"))
    (g,) = read_graph_db(db)["graphs"]
    assert "unmatched" not in g["verdict"] and "golden" not in g["side"]


def test_graph_command_reads_compare_json(transformer_dumps, tmp_path):
    golden, target = transformer_dumps
    cfg = tmp_path / "compare.json"
    cfg.write_text(json.dumps({"npu_path": os.path.join(target, "dump.json"),
                               "bench_path": os.path.join(golden, "dump.json"),
                               "stack_path": os.path.join(target, "stack.json"), "is_print_compare_log": True}))
    res = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "graph", "-i", str(cfg), "-o", str(tmp_path / "a"),
                          "--no-progress"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    direct = visualize(target, str(tmp_path / "b"), golden_path=golden, progress=False)
    (db,) = glob.glob(str(tmp_path / "a" / "compare_*.vis.db"))
    via_json = read_graph_db(db)["graphs"][0]
    (ref,) = read_graph_db(direct.db_path)["graphs"]
    assert via_json["names"] == ref["names"] and via_json["verdict"] == ref["verdict"]
    assert "error" in via_json["verdict"]


@pytest.mark.parametrize("folder", [("pt_dump", "transformer_statistics_mix_statistics"),
                                    ("ms_dump", "statistics_mix_statistics_shim")])
def test_msprobe_sample_compared_with_itself_passes(folder, tmp_path):
    src = os.path.join(os.path.dirname(__file__), os.pardir, "data", "msprobe-samples", *folder)
    out = visualize(src, str(tmp_path), golden_path=src, progress=False)
    (g,) = read_graph_db(out.db_path)["graphs"]
    with_rows = {t["node_id"] for t in g["tensors"]}
    assert with_rows and {g["verdict"][i] for i in with_rows} == {"pass"}
    assert all(m == n for n, m in zip(g["names"], g["match"]))
    assert out.document["diagnosis"]["divergence"] is False


def test_fuzzy_match_realigns_shifted_call_indexes(tmp_path):
    golden = graph_dumps.dump_transformer(tmp_path / "golden", layers=2)
    target = graph_dumps.dump_transformer(tmp_path / "target", layers=2, extra_add=True)
    exact = visualize(target, str(tmp_path / "exact"), golden_path=golden, progress=False).document["graphs"][0]
    fuzzy = visualize(target, str(tmp_path / "fuzzy"), golden_path=golden, fuzzy_match=True,
                      progress=False).document["graphs"][0]
    adds = [n for n in fuzzy["names"] if n.startswith("Tensor.__add__.") and n.endswith(".forward")]
    assert len(adds) >= 5
    match = dict(zip(fuzzy["names"], fuzzy["match"]))
    verdict = dict(zip(fuzzy["names"], fuzzy["verdict"]))
    assert match["Tensor.__add__.0.forward"] is None and verdict["Tensor.__add__.0.forward"] == UNMATCHED
    for k in range(1, len(adds)):  # each later add pairs with the golden call one index lower
        assert match[f"Tensor.__add__.{k}.forward"] == f"Tensor.__add__.{k - 1}.forward"
    # without -fm too: the runs call __add__ a different number of times, so compare aligns by itself
    exact_match = dict(zip(exact["names"], exact["match"]))
    assert exact_match["Tensor.__add__.1.forward"] == "Tensor.__add__.0.forward"

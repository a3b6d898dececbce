"""The hierarchy built from construct.json / dump.json / stack.json: ours and msProbe's, PT and MS."""

import json
import os
import subprocess
import sys

import pytest

import graph_dumps
from graph_db import read_graph_db
from msprobe.core.errors import DumpFormatError, MsprobeError
from msprobe.core.graph.build import visualize
from msprobe.core.graph.hierarchy import graph_from_dump, tensor_entries

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE_DIR = os.path.join(HERE, os.pardir, "data", "msprobe-samples")  # msProbe sample dumps, checked in


def sample(*parts):
    return os.path.join(SAMPLE_DIR, *parts)


def depth(graph, name):
    d, node = 0, graph.nodes[name]
    while node.parent:
        d, node = d + 1, graph.nodes[node.parent]
    return d


def test_tree_follows_construct_json_and_execution_order(transformer_dumps):
    golden, _ = transformer_dumps
    g = graph_from_dump(golden)
    construct = json.load(open(os.path.join(golden, "construct.json")))
    data = json.load(open(os.path.join(golden, "dump.json")))["data"]
    assert set(g.nodes) >= set(data) | set(construct)
    for key, parent in construct.items():
        assert g.nodes[key].parent == parent, key
    names = list(g.nodes)
    position = {n: i for i, n in enumerate(names)}
    for name, node in g.nodes.items():  # pre-order: parent first, children inside the parent's span
        if node.parent:
            assert position[node.parent] < position[name]
            assert name in g.nodes[node.parent].children
    # execution order of the forward pass: embedding, then the blocks in order, then the head
    tops = [r for r in g.roots if r.startswith("Module.") and ".forward." in r]
    assert tops == ["Module.emb.Embedding.forward.0", "Module.blocks.0.Block.forward.0",
                    "Module.blocks.1.Block.forward.0", "Module.blocks.2.Block.forward.0",
                    "Module.ln_f.LayerNorm.forward.0", "Module.head.Linear.forward.0"]
    block1 = g.nodes["Module.blocks.1.Block.forward.0"].children
    assert block1[0] == "Module.blocks.1.ln1.LayerNorm.forward.0"  # module placed at its first API
    assert g.nodes["Functional.linear.0.forward"].parent == "Module.blocks.0.qkv.Linear.forward.0"
    assert depth(g, "Functional.linear.0.forward") == 2
    # the optimizer's updates sit under a scope node that has no record of its own
    assert g.nodes["optimizer"].kind == "scope" and g.nodes["optimizer"].record is None
    assert all(g.nodes[c].kind == "api" for c in g.nodes["optimizer"].children)


def test_parameter_gradients_hang_under_their_backward_module(transformer_dumps):
    g = graph_from_dump(transformer_dumps[0])
    grads = [n for n in g.nodes.values() if n.kind == "params_grad"]
    assert grads
    for n in grads:
        assert n.parent == n.name.replace("parameters_grad", "backward")
        entries = tensor_entries(n.name, n.record)
        forward = g.nodes[n.name.replace("parameters_grad", "forward")].record
        assert {e[0].split(".parameters_grad.0.")[1].split(".")[0] for e in entries} == set(forward["parameters"])


def test_tensor_entries_are_named_like_compare_rows(transformer_dumps):
    g = graph_from_dump(transformer_dumps[0])
    names = [e[0] for e in tensor_entries("Module.blocks.0.qkv.Linear.forward.0",
                                          g.nodes["Module.blocks.0.qkv.Linear.forward.0"].record)]
    assert names == ["Module.blocks.0.qkv.Linear.forward.0.input.0", "Module.blocks.0.qkv.Linear.forward.0.output.0",
                     "Module.blocks.0.qkv.Linear.forward.0.parameters.weight",
                     "Module.blocks.0.qkv.Linear.forward.0.parameters.bias"]
    assert g.find_node("Functional.linear.0.forward.output.0") == "Functional.linear.0.forward"
    assert g.find_node("Module.blocks.0.qkv.Linear.forward.0.parameters.weight") == \
        "Module.blocks.0.qkv.Linear.forward.0"
    assert g.find_node("Nothing.here.0.forward.output.0") is None


def test_stacks_come_from_stack_json(transformer_dumps):
    g = graph_from_dump(transformer_dumps[0])
    lines = g.stacks["Functional.softmax.1.forward"]
    assert any("graph_dumps.py" in line and "softmax" in line for line in lines)


@pytest.mark.parametrize("folder, framework, top", [
    (("pt_dump", "transformer_statistics_mix_statistics"), "pytorch", "Module.emb.Embedding.forward.0"),
    (("pt_dump", "mlp_statistics_L0_statistics"), "pytorch", None),
    (("pt_dump", "transformer_structure_mix_statistics"), "pytorch", "Module.emb.Embedding.forward.0"),
    (("ms_dump", "statistics_mix_statistics_shim"), "mindspore", "Cell.fc1.Linear.forward.0"),
    (("ms_dump", "statistics_L0_statistics_shim"), "mindspore", "Cell.fc1.Linear.forward.0"),
])
def test_msprobe_sample_dumps_load(folder, framework, top):
    g = graph_from_dump(sample(*folder))
    construct = json.load(open(sample(*folder, "construct.json")))
    assert g.framework == framework
    assert set(construct) <= set(g.nodes)
    if top:
        assert g.roots[0] == top
    modules = [n for n in g.nodes.values() if n.kind == "module"]
    assert modules and all(n.name.split(".")[0] == ("Cell" if framework == "mindspore" else "Module")
                           for n in modules)
    assert any(g.stacks.get(n) for n in g.nodes)


def test_l1_dump_is_refused_with_a_clear_message():
    with pytest.raises(MsprobeError, match=r"no model hierarchy \(its level is L1\).*level L0 or mix"):
        graph_from_dump(sample("pt_dump", "mlp_statistics_L1_md5"))


def test_corrupt_construct_json_is_a_dump_format_error(tmp_path, transformer_dumps):
    rank = tmp_path / "step0" / "rank0"
    rank.mkdir(parents=True)
    for f in ("dump.json", "stack.json"):
        (rank / f).write_text(open(os.path.join(transformer_dumps[0], f)).read())
    (rank / "construct.json").write_text('{"Functional.linear.0.forward": "Module.')
    with pytest.raises(DumpFormatError, match="construct.json: not valid JSON"):
        graph_from_dump(str(rank))


def test_overflow_levels_mark_where_inf_appears(tmp_path):
    rank = graph_dumps.dump_overflow(tmp_path / "dump")
    out = visualize(rank, str(tmp_path / "out"), overflow_check=True, progress=False)
    (g,) = out.document["graphs"]
    levels = {name: out.document["overflow_levels"][lv] for name, lv in zip(g["names"], g["overflow"])}
    assert levels["Torch.exp.0.forward"] == "critical"      # finite in, inf out: it made the overflow
    assert levels["Tensor.sum.0.forward"] == "high"         # inf in, inf out: passed on
    assert levels["Tensor.__mul__.0.forward"] == ""
    assert levels["Module.fc.Linear.forward.0"] == ""
    plain = visualize(rank, str(tmp_path / "out"), overflow_check=False, progress=False)
    assert not any(plain.document["graphs"][0]["overflow"])


def test_cli_builds_page_and_data(tmp_path, transformer_dumps):
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "graph_visualize", "-tp",
                          os.path.dirname(transformer_dumps[0]), "-o", str(out), "--no-progress"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    html = [f for f in os.listdir(out) if f.endswith(".html")]
    data = [f for f in os.listdir(out) if f.endswith(".vis.db")]
    assert len(html) == 1 and len(data) == 1 and html[0].startswith("build_")
    doc = read_graph_db(str(out / data[0]))
    (g,) = doc["graphs"]
    assert doc["mode"] == "build" and g["names"] == list(graph_from_dump(transformer_dumps[0]).nodes)
    assert all(p < i for i, p in enumerate(g["parent"]))
    stats = [t for t in g["tensors"] if t["NPU Name"] == "Functional.linear.0.forward.output.0"]
    record = json.load(open(os.path.join(transformer_dumps[0], "dump.json")))["data"]["Functional.linear.0.forward"]
    assert len(stats) == 1 and stats[0]["NPU max"] == record["output"][0]["Max"]
    page = (out / html[0]).read_text()
    assert "<script src" not in page and "http://" not in page and "https://" not in page  # no network


def test_cli_l1_dump_is_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "graph_visualize", "-tp",
                          sample("pt_dump", "mlp_statistics_L1_md5"), "-o", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert res.stderr.count("\n") == 1 and "level L0 or mix" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("flag", ["-tp", "-gp", "-lm"])
def test_a_missing_path_is_one_line_from_the_command_and_from_python(tmp_path, transformer_dumps, flag):
    missing = str(tmp_path / "missing")
    paths = {"-tp": transformer_dumps[1], "-gp": transformer_dumps[1], "-lm": None}
    paths[flag] = missing
    args = [a for f, v in paths.items() if v is not None for a in (f, v)]
    res = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "graph_visualize", *args, "-o", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert res.stderr == f"msprobe graph_visualize: {flag} '{missing}': no such file or directory\n"
    with pytest.raises(MsprobeError, match=f"{flag} '{missing}': no such file"):
        visualize(paths["-tp"], str(tmp_path), golden_path=paths["-gp"], layer_mapping=paths["-lm"])
    assert not os.path.exists(missing)


def test_cli_compare_json_is_validated(tmp_path, transformer_dumps):
    bad = tmp_path / "compare.json"
    bad.write_text(json.dumps({"npu_path": transformer_dumps[1], "bench_path": str(tmp_path / "missing")}))
    res = subprocess.run([sys.executable, "-m", "msprobe.cli.main", "graph", "-i", str(bad), "-o", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert "compare.json: bench_path'" in res.stderr and "an existing dump.json" in res.stderr

"""The viewer page driven in real headless Chromium: a compare graph of an fp32 run and a perturbed run
(our PyTorch dumper, level mix), checked against the compare CSV that `msprobe compare` writes.

Screenshots land in the test's tmp dir; set MSPROBE_GRAPH_SHOTS=<dir> to keep copies to look at.
"""

import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest

import graph_dumps
from graph_db import read_graph_db

_SUFFIX = re.compile(r"\.(input|output|parameters|parameters_grad)\..*$|\.(input|output)$")


def msprobe(*args):
    res = subprocess.run([sys.executable, "-m", "msprobe.cli.main", *args], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    return res


def node_of(tensor_name):
    """The call a compare row belongs to: its name without the tensor part."""
    base = _SUFFIX.sub("", tensor_name)
    m = re.match(r"^(.*\.parameters_grad\.\d+)\..*$", tensor_name)
    return m.group(1) if m else base


def keep_shot(page, tmp_path, name):
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=False)
    assert path.stat().st_size > 10_000  # a rendered page, not a blank one
    if os.environ.get("MSPROBE_GRAPH_SHOTS"):
        os.makedirs(os.environ["MSPROBE_GRAPH_SHOTS"], exist_ok=True)
        shutil.copy(path, os.environ["MSPROBE_GRAPH_SHOTS"])
    return path


@pytest.fixture(scope="module")
def compared(transformer_dumps, tmp_path_factory):
    """(page path, compare CSV table, document) for target=perturbed vs golden=fp32."""
    golden, target = transformer_dumps
    out = tmp_path_factory.mktemp("compared")
    msprobe("compare", "-tp", target, "-gp", golden, "-o", str(out / "csv"))
    (csv,) = glob.glob(str(out / "csv" / "*.csv"))
    msprobe("graph_visualize", "-tp", target, "-gp", golden, "-o", str(out / "graph"), "--no-progress")
    (html,) = glob.glob(str(out / "graph" / "*.html"))
    (data,) = glob.glob(str(out / "graph" / "*.vis.db"))
    table = pd.read_csv(csv, keep_default_na=False, dtype=str)
    return html, table, read_graph_db(data)


def visible_names(page):
    return page.eval_on_selector_all(
        "#spacer .row", "els => els.filter(e => e.style.display !== 'none').map(e => e.dataset.name)")


def row(page, name):
    return page.locator(f"#spacer .row[data-name='{name}']")


def same_number(shown, csv_value):
    """The page shows 7 significant digits; the CSV has the full value."""
    try:
        a, b = float(shown), float(csv_value)
    except ValueError:
        return shown.strip() == csv_value.strip()
    if math.isnan(b):
        return math.isnan(a)
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def test_compare_page_expand_search_filter_detail(compared, open_page, tmp_path):
    html, table, doc = compared
    page = open_page(html)
    (g,) = doc["graphs"]

    # first render: top-level nodes only, in execution order
    top = [n for n, p in zip(g["names"], g["parent"]) if p < 0]
    assert visible_names(page)[:5] == top[:5]
    assert "Module.blocks.0.ln1.LayerNorm.forward.0" not in visible_names(page)

    # expand a module: its children appear right below it; collapse hides them again
    row(page, "Module.blocks.0.Block.forward.0").locator(".tw").click()
    names = visible_names(page)
    at = names.index("Module.blocks.0.Block.forward.0")
    assert names[at + 1] == "Module.blocks.0.ln1.LayerNorm.forward.0"
    assert "Functional.softmax.0.forward" in names
    row(page, "Module.blocks.0.Block.forward.0").locator(".tw").click()
    assert "Functional.softmax.0.forward" not in visible_names(page)

    # search an API: case-insensitive, reveals and selects the first match, Enter goes to the next
    page.fill("#search", "SOFTMAX.1")
    page.wait_for_function("document.getElementById('search-count').textContent.includes('/')")
    assert page.inner_text("#search-count") == "1 / 2"  # forward and backward call
    assert page.inner_text("#detail h2") == "Functional.softmax.1.forward"
    assert "selected" in row(page, "Functional.softmax.1.forward").get_attribute("class")
    page.press("#search", "Enter")
    assert page.inner_text("#detail h2") == "Functional.softmax.1.backward"
    page.fill("#search", "")

    # filter to errors: exactly the calls whose compare rows hold an error, with their enclosing modules
    error_nodes = sorted({node_of(n) for n in table.loc[table["Result"] == "error", "NPU Name"]})
    assert error_nodes, "the perturbed run must produce errors"
    page.check("#filters input[data-filter='error']")
    shown = visible_names(page)
    errors_shown = [n for n in shown if "v-error" in row(page, n).get_attribute("class")]
    assert sorted(errors_shown) == error_nodes
    for n in shown:  # everything else shown is an ancestor of an error
        assert n in error_nodes or any(e in doc_descendants(g, n) for e in error_nodes), n

    # the first error's detail panel holds the CSV's numbers
    first = page.inner_text("#detail h2")
    assert first == errors_shown[0]
    assert page.inner_text("#detail-verdict") == "error"
    cards = page.locator("#detail .tensor")
    rows = table[table["NPU Name"].map(node_of) == first]
    assert cards.count() == len(rows)
    checked = 0
    for i in range(cards.count()):
        card = cards.nth(i)
        csv_row = rows[rows["NPU Name"] == card.get_attribute("data-name")].iloc[0]
        assert card.locator(".result").inner_text() == csv_row["Result"]
        for cell in card.locator("td[data-col]").all():
            col = cell.get_attribute("data-col")
            if col == "Err_message":
                continue
            assert same_number(cell.inner_text(), csv_row[col].strip()), (col, cell.inner_text(), csv_row[col])
            checked += 1
        if csv_row["Result"] == "error":
            assert json.loads(csv_row["Err_message"].replace("'", '"'))[0] in card.inner_text()
    assert checked >= 20
    keep_shot(page, tmp_path, "compare_errors.png")


def doc_descendants(g, name):
    i = g["names"].index(name)
    out, frontier = set(), {i}
    for j in range(i + 1, len(g["names"])):
        if g["parent"][j] in frontier:
            frontier.add(j)
            out.add(g["names"][j])
    return out


def test_start_here_is_the_diagnosis_first_suspect(compared, open_page, tmp_path):
    html, _, doc = compared
    suspect = doc["diagnosis"]["suspects"][0]["api"]
    assert suspect == "Tensor.__mul__.1.forward"  # the planted score scale in block 1
    page = open_page(html)
    assert suspect in page.inner_text("#start-here")
    page.click("#go-start")
    assert page.inner_text("#detail h2") == suspect
    assert row(page, suspect).locator(".badge.start").inner_text() == "start here"
    assert "Module.blocks.1.Block.forward.0" in visible_names(page)  # its module was expanded
    keep_shot(page, tmp_path, "start_here.png")


def test_diagnosis_labels_agree_in_page_csv_and_json(compared, open_page):
    """One story everywhere: the suspect's rows are `introduces` in the CSV's Diagnosis column, in its
    tensor cards and its tree badge, and in the evidence of diagnosis.json."""
    html, table, doc = compared
    top = doc["diagnosis"]["suspects"][0]
    csv_rows = table[table["NPU Name"].map(node_of) == top["api"]].set_index("NPU Name")["Diagnosis"]
    assert "introduces" in set(csv_rows)
    for evidence in top["inputs"] + top["outputs"]:
        assert csv_rows[evidence["name"]] == evidence["diagnosis"]
    page = open_page(html)
    page.click("#go-start")
    assert row(page, top["api"]).locator(".badge.diag").inner_text() == "introduces"
    assert page.inner_text("#detail-diagnosis") == "introduces"
    cards = page.locator("#detail .tensor")
    for i in range(cards.count()):
        card = cards.nth(i)
        assert card.locator(".diag").inner_text() == csv_rows[card.get_attribute("data-name")]


def test_unmatched_filter_and_keyboard(compared, open_page):
    html, table, _ = compared
    page = open_page(html)
    page.check("#filters input[data-filter='unmatched']")
    unmatched = [n for n in visible_names(page) if "v-unmatched" in row(page, n).get_attribute("class")]
    expected = sorted({node_of(n) for n in table.loc[table["Bench Name"] == "N/A", "NPU Name"]})
    assert sorted(unmatched) == expected and "Torch.clamp.0.forward" in unmatched
    page.uncheck("#filters input[data-filter='unmatched']")
    assert "Torch.clamp.0.forward" in visible_names(page)  # its block stays open after the filter

    page = open_page(html)
    page.focus("#tree")
    page.keyboard.press("ArrowDown")
    names = visible_names(page)
    assert page.inner_text("#detail h2") == names[0]
    page.keyboard.press("s")
    assert page.inner_text("#detail h2") == names[1]  # Module.emb.Embedding.forward.0
    page.keyboard.press("d")                             # expand
    assert visible_names(page)[2] == "Functional.embedding.0.forward"
    page.keyboard.press("ArrowRight")                    # already open: go to the first child
    assert page.inner_text("#detail h2") == "Functional.embedding.0.forward"
    page.keyboard.press("ArrowLeft")                     # a leaf: go to the parent
    assert page.inner_text("#detail h2") == names[1]
    page.keyboard.press("a")                             # collapse
    assert "Functional.embedding.0.forward" not in visible_names(page)
    page.keyboard.press("e")                             # next error
    assert page.inner_text("#detail-verdict") == "error"
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "search"


def test_step_and_rank_selectors(tmp_path, open_page):
    """A real 2-process gloo run, two steps, dumped twice; the target differs only on rank 1, whose
    loss reaches rank 0 through an all_reduce."""
    golden, target = graph_dumps.dump_two_ranks(tmp_path, perturbed_rank=1, steps=2)
    msprobe("graph_visualize", "-tp", target, "-gp", golden, "-o", str(tmp_path / "out"), "--no-progress")
    (html,) = glob.glob(str(tmp_path / "out" / "*.html"))
    page = open_page(html)
    assert page.eval_on_selector_all("#step-select option", "o => o.map(x => x.value)") == ["0", "1"]
    assert page.eval_on_selector_all("#rank-select option", "o => o.map(x => x.value)") == ["0", "1"]
    # rank 0 computes like its golden; only the all_reduce brings rank 1's difference in
    assert "Distributed.all_reduce.0.forward" in page.inner_text("#start-here")
    page.check("#filters input[data-filter='error']")
    assert page.inner_text("#detail") == "Nothing matches these filters."
    page.select_option("#rank-select", "1")
    page.wait_for_selector("body[data-ready='1'][data-graph='0:1']")
    assert "Tensor.__mul__.1.forward" in page.inner_text("#start-here")
    assert not page.is_checked("#filters input[data-filter='error']")  # filters reset per graph
    page.select_option("#step-select", "1")
    page.wait_for_selector("body[data-ready='1'][data-graph='1:0']")
    assert page.input_value("#rank-select") == "0"
    page.select_option("#rank-select", "1")
    page.wait_for_selector("body[data-ready='1'][data-graph='1:1']")
    page.check("#filters input[data-filter='error']")
    assert page.inner_text("#detail-verdict") == "error"
    assert page.inner_text("#detail h2") == "Tensor.__mul__.1.forward"


@pytest.mark.parametrize("folder", [("pt_dump", "transformer_statistics_mix_statistics"),
                                    ("ms_dump", "statistics_mix_statistics_shim")])
def test_msprobe_sample_dumps_render(folder, tmp_path, open_page):
    src = os.path.join(os.path.dirname(__file__), os.pardir, "data", "msprobe-samples", *folder)
    msprobe("graph_visualize", "-tp", src, "-o", str(tmp_path), "--no-progress")
    (html,) = glob.glob(str(tmp_path / "*.html"))
    construct = json.load(open(os.path.join(src, "construct.json")))
    page = open_page(html)
    roots = [k for k, v in construct.items() if v is None]
    shown = visible_names(page)
    assert set(roots) <= set(shown)
    module = next(k for k, v in construct.items() if v is None and k.split(".")[0] in ("Module", "Cell")
                  and any(p == k for p in construct.values()))
    row(page, module).click()
    assert page.inner_text("#detail h2") == module
    assert "Call stack" in page.inner_text("#detail")
    keep_shot(page, tmp_path, f"sample_{folder[0]}.png")


def test_overflow_filter_and_badges(tmp_path, open_page):
    rank = graph_dumps.dump_overflow(tmp_path / "dump")
    msprobe("graph_visualize", "-tp", rank, "-o", str(tmp_path / "out"), "-oc", "--no-progress")
    (html,) = glob.glob(str(tmp_path / "out" / "*.html"))
    page = open_page(html)
    assert page.is_visible(".f-overflow") and page.is_hidden(".f-error")  # one graph: no compare filters
    page.check("#filters input[data-filter='overflow']")
    badges = dict(page.eval_on_selector_all(
        "#spacer .row", "els => els.filter(e => e.style.display !== 'none')"
                        ".map(e => [e.dataset.name, (e.querySelector('.badge.ovf') || {}).textContent || ''])"))
    assert badges == {"Torch.exp.0.forward": "overflow critical", "Tensor.sum.0.forward": "overflow high"}
    assert page.inner_text("#detail h2") == "Torch.exp.0.forward"
    assert page.inner_text("#detail .tensor[data-name='Torch.exp.0.forward.output.0'] td[data-col='NPU max']") == "inf"


def test_hostile_names_and_stacks_stay_text(tmp_path, open_page):
    """A dump whose node name and stack lines carry HTML and script: the page shows them as text and runs
    nothing (the tree, the detail panel and the stack)."""
    hostile = "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>"
    src = os.path.join(os.path.dirname(__file__), os.pardir, "data", "msprobe-samples", "pt_dump",
                       "transformer_statistics_mix_statistics")
    dump = tmp_path / "step0" / "rank0"
    shutil.copytree(src, dump)
    doc = json.load(open(dump / "dump.json"))
    evil = f"Functional.{hostile}.0.forward"
    doc["data"][evil] = doc["data"]["Functional.embedding.0.forward"]
    json.dump(doc, open(dump / "dump.json", "w"))
    construct = json.load(open(dump / "construct.json"))
    construct[evil] = "Module.emb.Embedding.forward.0"
    json.dump(construct, open(dump / "construct.json", "w"))
    stacks = {k: [keys, [hostile] * 3] for k, (keys, _) in json.load(open(dump / "stack.json")).items()}
    stacks["evil"] = [[evil], [hostile]]
    json.dump(stacks, open(dump / "stack.json", "w"))
    msprobe("graph_visualize", "-tp", str(dump), "-o", str(tmp_path / "out"), "--no-progress")
    (html,) = glob.glob(str(tmp_path / "out" / "*.html"))
    page = open_page(html)
    page.click("#spacer .row[data-name='Module.emb.Embedding.forward.0'] .tw")
    node = page.locator("#spacer .row").filter(has_text="onerror")
    assert node.count() == 1
    node.click()
    assert page.inner_text("#detail h2") == evil
    assert hostile in page.inner_text("#detail pre.stack")
    page.wait_for_timeout(300)
    assert page.evaluate("window.pwned") is None
    assert page.eval_on_selector_all("#detail img, #spacer img, #detail script", "e => e.length") == 0

"""How fast the graph page draws a big model, against a page that puts every row in the DOM.

Dumps a 24-layer transformer (level mix, statistics) twice with msprobe's PyTorch dumper (fp32 and a
perturbed run), repeats the micro-batch to 1, 4 and 13 micro-batches (about 2k, 8k and 21k nodes),
builds the compare page of each with `msprobe.core.graph`, and opens it in headless Chromium.

Measured per size, the variants taking turns, medians over --rounds:

  page first render  navigation start -> tree drawn (our page, collapsed tree, virtualised rows)
  page ready         navigation start -> tensor details decoded as well
  expand all         every node expanded and redrawn (in-page time)
  naive              navigation start -> layout done for a page holding one DOM row per node
                     (the same names and colours, fully expanded, no virtualisation): the baseline

    python benchmarks/graph_render.py                # 5 rounds
    python benchmarks/graph_render.py --rounds 3 --sizes 1,13
    python benchmarks/graph_render.py --quick               # smoke: 1 round, the smallest size
"""

import argparse
import html
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "graph"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import harness  # noqa: E402  (beside this script: the rounds' options, order and medians)

CHROMIUM = os.environ.get("MSPROBE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
COLOURS = ("#fff", "#FFFCF3", "#FFDC7F", "#FF704D", "#C7C7C7")


def naive_page(graph, path):
    """Every node as a positioned DOM row, as a tree view without virtualisation would draw it expanded."""
    depth = []
    rows = []
    for i, (name, parent) in enumerate(zip(graph["names"], graph["parent"])):
        depth.append(depth[parent] + 1 if parent >= 0 else 0)
        rows.append(f'<div class="row" style="padding-left:{4 + depth[i] * 14}px;'
                    f'background:{COLOURS[graph["verdict"][i]]}"><span class="tw">&#9656;</span>'
                    f'<span class="name">{html.escape(name)}</span></div>')
    with open(path, "w") as f:
        f.write("<!DOCTYPE html><html><head><meta charset='utf-8'><style>"
                ".row{height:22px;display:flex;align-items:center;white-space:nowrap;border-bottom:1px solid #eee;"
                "font:12px monospace}#tree{height:760px;overflow:auto}</style></head><body><div id='tree'>"
                + "".join(rows) +
                "</div><script>document.getElementById('tree').offsetHeight;"
                "window.__done = performance.now();</script></body></html>")


def build_pages(workdir, sizes, log):
    import graph_dumps
    from msprobe.core.graph.build import visualize

    log("dumping a 24-layer transformer twice (level mix) ...")
    golden = graph_dumps.dump_transformer(os.path.join(workdir, "g1"), layers=24, d=8)
    target = graph_dumps.dump_transformer(os.path.join(workdir, "t1"), layers=24, d=8, perturbed=True)
    pages = {}
    for copies in sizes:
        g = graph_dumps.tile_dump(golden, os.path.join(workdir, f"golden{copies}", "step0", "rank0"), copies)
        t = graph_dumps.tile_dump(target, os.path.join(workdir, f"target{copies}", "step0", "rank0"), copies)
        start = time.perf_counter()
        out = visualize(t, os.path.join(workdir, f"out{copies}"), golden_path=g, progress=False)
        build_s = time.perf_counter() - start
        (graph,) = out.document["graphs"]
        naive = os.path.join(workdir, f"naive{copies}.html")
        naive_page(graph, naive)
        pages[copies] = {"nodes": len(graph["names"]), "page": out.html_path, "naive": naive, "build_s": build_s,
                         "page_mb": os.path.getsize(out.html_path) / 1e6}
        log(f"  {copies} micro-batch(es): {len(graph['names'])} nodes, page {pages[copies]['page_mb']:.1f} MB")
    return pages


def measure_page(browser, path):
    page = browser.new_page(viewport={"width": 1400, "height": 800})
    page.goto("file://" + path)
    page.wait_for_selector("body[data-ready='1']", timeout=300_000)
    ready = page.evaluate("window.__graphReady")
    expand = page.evaluate("() => { const t = performance.now(); document.getElementById('expand-all').click();"
                           " document.getElementById('tree').offsetHeight; return performance.now() - t; }")
    rows = page.eval_on_selector_all("#spacer .row", "e => e.filter(x => x.style.display !== 'none').length")
    page.close()
    return ready["treeAt"], ready["readyAt"], expand, rows


def measure_naive(browser, path):
    page = browser.new_page(viewport={"width": 1400, "height": 800})
    page.goto("file://" + path, timeout=300_000)
    page.wait_for_function("window.__done !== undefined", timeout=300_000)
    done = page.evaluate("window.__done")
    page.close()
    return done


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_options(parser, rounds=5, quick=(1,))
    parser.add_argument("--sizes", default="1,4,13", help="micro-batch counts (default 1,4,13; --quick: 1)")
    args = parser.parse_args()
    harness.check_common_options(parser, args)
    sizes = [1] if args.quick else [int(s) for s in args.sizes.split(",")]
    log = harness.logger(args.quiet)

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as workdir:
        pages = build_pages(workdir, sizes, log)
        samples = {c: {"first": [], "ready": [], "expand": [], "naive": [], "rows": 0} for c in sizes}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            for r in range(args.rounds):
                log(f"round {r + 1}/{args.rounds}")
                for c in sizes:  # interleaved: ours and the baseline take turns first, round by round
                    for which in harness.rotated((0, 1), r):
                        if which == 0:
                            first, ready, expand, rows = measure_page(browser, pages[c]["page"])
                            samples[c]["first"].append(first)
                            samples[c]["ready"].append(ready)
                            samples[c]["expand"].append(expand)
                            samples[c]["rows"] = rows
                        else:
                            samples[c]["naive"].append(measure_naive(browser, pages[c]["naive"]))
            browser.close()

    med = {c: {k: harness.median(v) for k, v in s.items() if isinstance(v, list)} for c, s in samples.items()}
    print(f"\nGraph page vs one-DOM-row-per-node page, headless Chromium, medians of {args.rounds} rounds")
    print(f"{'nodes':>7} {'page MB':>8} {'first render':>13} {'ready':>8} {'expand all':>11} {'naive':>9} "
          f"{'naive/first':>12} {'DOM rows':>9}")
    for c in sizes:
        m = med[c]
        print(f"{pages[c]['nodes']:>7} {pages[c]['page_mb']:>8.1f} {m['first']:>10.0f} ms {m['ready']:>5.0f} ms "
              f"{m['expand']:>8.0f} ms {m['naive']:>6.0f} ms {m['naive'] / m['first']:>11.1f}x "
              f"{samples[c]['rows']:>9}")
    small, big = sizes[0], sizes[-1]
    print(f"\nscaling {pages[small]['nodes']} -> {pages[big]['nodes']} nodes "
          f"({pages[big]['nodes'] / pages[small]['nodes']:.1f}x): first render "
          f"{med[big]['first'] / med[small]['first']:.2f}x, naive {med[big]['naive'] / med[small]['naive']:.2f}x")
    harness.write_json(args.json, {"pages": {str(c): {k: v for k, v in pages[c].items() if k not in ("page", "naive")}
                                             for c in sizes},
                                   "medians_ms": {str(c): med[c] for c in sizes}})


if __name__ == "__main__":
    from results_file import run_recorded  # beside this script; `--record` writes RESULTS.md
    sys.exit(run_recorded("graph_render.py", main))

"""Make docs/images/graph_viewer.png, the README's picture: the tour's two runs of the example transformer
(fp32, and block 1's softmax in bfloat16) drawn by `msprobe graph_visualize`, opened in headless Chromium
at the call the diagnosis names.

    python scripts/readme_picture.py [--out docs/images/graph_viewer.png]

Needs the `test` extra (playwright) and Debian's chromium (or MSPROBE_CHROMIUM).
"""

import argparse
import importlib.util
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = os.environ.get("MSPROBE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def _train_module():
    spec = importlib.util.spec_from_file_location("msprobe_example_train", os.path.join(ROOT, "examples", "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def graph_page(work):
    """Dump both runs and draw them; returns the HTML page's path."""
    from msprobe.core.graph.build import visualize
    train = _train_module()
    train.train("pytorch", "transformer", 1, dump=os.path.join(work, "run_fp32"))
    train.train("pytorch", "transformer", 1, dump=os.path.join(work, "run_bf16"), plant=("bf16-softmax", None))
    out = visualize(os.path.join(work, "run_bf16"), os.path.join(work, "graph"),
                    golden_path=os.path.join(work, "run_fp32"), progress=False)
    return out.html_path


def screenshot(html_path, png_path, width=1400, height=760):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto("file://" + os.path.abspath(html_path))
        page.wait_for_selector("body[data-ready='1']", timeout=60000)
        page.keyboard.press("e")            # to the first error, with its details beside the tree
        page.wait_for_timeout(300)
        page.screenshot(path=png_path)
        browser.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "images", "graph_viewer.png"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        screenshot(graph_page(work), args.out)
    print(f"wrote {os.path.abspath(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

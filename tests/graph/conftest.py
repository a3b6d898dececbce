"""Fixtures for the graph tests: real dumps from our PyTorch dumper and a real headless Chromium."""

import os
import shutil

import pytest

import graph_dumps

CHROMIUM = os.environ.get("MSPROBE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def transformer_dumps(tmp_path_factory):
    """(golden fp32 rank dir, perturbed target rank dir) of a 3-block transformer at level mix."""
    root = tmp_path_factory.mktemp("graph_dumps")
    golden = graph_dumps.dump_transformer(root / "golden", layers=3)
    target = graph_dumps.dump_transformer(root / "target", layers=3, perturbed=True)
    return golden, target


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium driven by Playwright (the Debian package, not a Playwright download)."""
    from playwright import sync_api  # the `test` extra installs it
    if not shutil.which(CHROMIUM) and not os.path.isfile(CHROMIUM):
        pytest.fail(f"Chromium not found at {CHROMIUM}: install the Debian 'chromium' package (.ci/run does)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def open_page(browser):
    """open_page(html_path) -> a loaded page; fails the test on any JavaScript error."""
    pages = []

    def go(path, width=1400, height=800):
        page = browser.new_page(viewport={"width": width, "height": height})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        # the page is self-contained: nothing may be fetched from anywhere but the file itself
        page.on("request", lambda r: errors.append("network: " + r.url)
                if not r.url.startswith(("file://", "data:", "blob:")) else None)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto("file://" + os.path.abspath(path))
        page.wait_for_selector("body[data-ready='1']", timeout=60000)
        page.js_errors = errors
        pages.append(page)
        return page

    yield go
    for page in pages:
        assert not page.js_errors, page.js_errors
        page.close()

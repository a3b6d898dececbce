"""Fixtures for the graph tests: real dumps from our PyTorch dumper, and pages opened in the session's headless Chromium."""

import os

import pytest

import graph_dumps


@pytest.fixture(scope="session")
def transformer_dumps(tmp_path_factory):
    """(golden fp32 rank dir, perturbed target rank dir) of a 3-block transformer at level mix."""
    root = tmp_path_factory.mktemp("graph_dumps")
    golden = graph_dumps.dump_transformer(root / "golden", layers=3)
    target = graph_dumps.dump_transformer(root / "target", layers=3, perturbed=True)
    return golden, target


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

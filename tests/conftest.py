"""Fixtures every test folder may use: one headless Chromium for the whole session (Playwright's sync API
runs its event loop while a browser is open, so a second `sync_playwright()` in the same process fails)."""

import os
import shutil

import pytest

CHROMIUM = os.environ.get("MSPROBE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


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

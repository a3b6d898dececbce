"""Fixtures every test folder may use: one headless Chromium for the whole session (Playwright's sync API
runs its event loop while a browser is open, so a second `sync_playwright()` in the same process fails);
the compare tests' real PyTorch dumps (tests/compare/runs.py, made once per session for tests/compare and
tests/core/compare alike), hand-written dump pairs, and each loop of the statistics kernel."""

import os
import shutil

import pytest

from compare_fixtures import write_dump
from msprobe.core.dump import moments
from msprobe.core.dump.moments import LOOPS
from private_modules import load_private

CHROMIUM = os.environ.get("MSPROBE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(params=range(3), ids=lambda level: LOOPS[level])
def kernel_loop(request):
    """The statistics kernel (msprobe._moments) runs each of its loops in turn: the portable one, AVX2 and
    AVX-512, those this CPU has (the others are skipped, saying so)."""
    if moments.kernel is None:
        pytest.skip("msprobe._moments not built")
    if request.param > moments.VECTORS:
        pytest.skip(f"this CPU has no {LOOPS[request.param]}")
    with moments.using_loop(request.param):
        yield request.param


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


@pytest.fixture(scope="session")
def runs():
    return load_private("msprobe_compare_test_runs", os.path.join(os.path.dirname(__file__), "compare", "runs.py"))


@pytest.fixture(scope="session")
def dumps(tmp_path_factory, runs):
    """dumps(variant, task, steps=1) -> dump root of a real one-step training run (cached)."""
    root = tmp_path_factory.mktemp("dumps")
    return lambda variant, task, **kw: runs.dump(root, variant, task, **kw)


@pytest.fixture
def make_pair(tmp_path):
    """make_pair(target_data, golden_data, **kw) -> (target rank dir, golden rank dir)."""
    def make(target, golden, target_kw=None, golden_kw=None, **kw):
        t = write_dump(tmp_path / "target", target, **{**kw, **(target_kw or {})})
        g = write_dump(tmp_path / "golden", golden, **{**kw, **(golden_kw or {})})
        return t, g
    return make

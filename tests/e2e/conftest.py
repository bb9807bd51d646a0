import pytest

from harness import CHROMIUM_FLAGS, Server


@pytest.fixture(scope="module")
def server():
    s = Server().start()
    yield s
    s.cleanup()


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium, driven by Playwright (which never
    downloads a browser of its own)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
        yield b
        b.close()

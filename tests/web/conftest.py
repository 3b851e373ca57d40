"""A real headless Chromium (Debian's package, driven by Playwright) for the dashboard's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from smon_server import dashboard
from tests.support.tools import debian_tool

REPO_ROOT = Path(__file__).resolve().parents[2]
# Screenshots of every page the tests visit: look at them before calling a change done.
SCREENSHOTS = REPO_ROOT / "build" / "test-output" / "web"


@pytest.fixture(scope="session")
def chromium() -> str:
    path = debian_tool("chromium", "chromium")
    debian_tool("chromedriver", "chromium-driver")
    return path


@pytest.fixture(scope="session")
def browser(chromium: str) -> Iterator[Any]:
    if not dashboard.is_built():
        pytest.fail("the dashboard is not built: run `make web` (make test does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(
            executable_path=chromium, args=["--disable-gpu", "--disable-dev-shm-usage"]
        )
        yield launched
        launched.close()


class PageErrors(list[str]):
    """Uncaught exceptions and console errors of one page: a test ends by asserting there were none."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[FAILED] = report.failed
    return report


FAILED = pytest.StashKey[bool]()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors = PageErrors()
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
    page.errors = errors
    yield page
    if request.node.stash.get(FAILED, False):
        # What the page showed when the test failed, and what it logged.
        screenshot(page, f"FAILED-{request.node.name}")
        print("\n".join(errors))
    context.close()


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path

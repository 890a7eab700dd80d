"""Open an hpcdl report in a real headless browser: Debian's Chromium
(scripts/install-browser.sh) driven by Playwright's Python client. Playwright never
downloads a browser here: it is pointed at /usr/bin/chromium.

``load`` opens a file:// URL with every request that is not a file:// or data: URL
refused and recorded (the report must need no network), collects console errors and
page errors, finds elements by CSS selector and takes a full-page screenshot.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
# Root needs --no-sandbox; the rest keep Chromium from reaching out (background
# networking, component updates, sync, QUIC), whose refused connections on this closed
# network would show up as errors, and from using a GPU there is none of.
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@dataclass
class Page:
    console_errors: list[str] = field(default_factory=list)
    requests_refused: list[str] = field(default_factory=list)
    found: dict[str, int] = field(default_factory=dict)  # selector -> how many elements
    texts: dict[str, str] = field(default_factory=dict)  # selector -> first one's text
    svg_sizes: dict[str, tuple[float, float]] = field(default_factory=dict)
    screenshot: Path | None = None


def require_browser() -> None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("playwright is not installed (pyproject's dev extra)")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install-browser.sh as root")


def load(report: Path, selectors: list[str], screenshot: Path) -> Page:
    """Open ``report`` and look: see the module doc."""
    from playwright.sync_api import sync_playwright

    require_browser()
    page_info = Page()
    profile = Path(tempfile.mkdtemp(prefix="hpcdl-chromium-"))
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, args=ARGS, headless=True,
                viewport={"width": 1280, "height": 900})
            try:
                page = browser.new_page()

                def route(r: object) -> None:
                    url = r.request.url  # type: ignore[attr-defined]
                    if url.startswith(("file://", "data:")):
                        r.continue_()  # type: ignore[attr-defined]
                    else:
                        page_info.requests_refused.append(url)
                        r.abort()  # type: ignore[attr-defined]

                page.route("**/*", route)
                page.on("console", lambda m: page_info.console_errors.append(m.text)
                        if m.type == "error" else None)
                page.on("pageerror", lambda e: page_info.console_errors.append(str(e)))
                page.goto(report.resolve().as_uri(), wait_until="load")
                for sel in selectors:
                    elements = page.query_selector_all(sel)
                    page_info.found[sel] = len(elements)
                    if elements:
                        page_info.texts[sel] = elements[0].inner_text()
                        svg = elements[0].query_selector("svg")
                        box = svg.bounding_box() if svg else None
                        if box:
                            page_info.svg_sizes[sel] = (box["width"], box["height"])
                page.screenshot(path=str(screenshot), full_page=True)
                page_info.screenshot = screenshot
            finally:
                browser.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return page_info

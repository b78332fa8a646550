"""/docs in a real headless Chromium: Swagger UI, from local assets only, renders the OpenAPI 3.1
document (the operations are drawn, no "does not specify a valid version field"), and a request
for anything off this origin would show as a console error or a failed load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cdp import Browser, find_chromium
from png import decode

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")]


@pytest.fixture
def browser() -> Any:
    assert CHROMIUM is not None
    b = Browser(CHROMIUM)
    try:
        yield b
    finally:
        b.close()


def test_docs_draw_the_operations_of_the_openapi_31_document(serve: Any, browser: Browser, screenshots: Path) -> None:
    with serve() as srv:
        page = browser.new_page()
        page.send("Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 1400, "deviceScaleFactor": 1, "mobile": False})
        page.navigate(f"{srv.url}/docs")
        page.wait_js(
            "document.querySelectorAll('.opblock').length > 0 || !!document.querySelector('.errors-wrapper, .loading-container .error')", timeout=60
        )
        text = page.evaluate("document.body.innerText")
        assert "does not specify a valid version field" not in text
        assert page.evaluate("document.querySelector('.errors-wrapper') === null"), text[:2000]
        ops = page.evaluate("[...document.querySelectorAll('.opblock-summary-path')].map(e => e.getAttribute('data-path'))")
        assert "/api/v1/snapshots/{snapshot_id}" in ops and "/api/v1/incidents" in ops, ops
        version = page.evaluate("(document.querySelector('.version-stamp, .info .version') || {}).textContent || ''")
        assert "OAS 3.1" in text or "3.1" in version, text[:500]

        # open one operation: its parameters and responses are drawn from the document
        page.evaluate("document.querySelector('.opblock-summary-path[data-path=\"/api/v1/snapshots/{snapshot_id}\"]').click()")
        page.wait_js("!!document.querySelector('.opblock.is-open .parameters-container')", timeout=20)
        opened = page.evaluate("document.querySelector('.opblock.is-open').innerText")
        assert "snapshot_id" in opened and "404" in opened and "no such snapshot" in opened
        browser.pump(0.3)
        assert page.console_errors() == []

        shot = page.screenshot(clip={"x": 0, "y": 0, "width": 1280, "height": 1400, "scale": 0.7})
        img = decode(shot)
        inked = sum(1 for y in range(0, img.height, 7) for x in range(0, img.width, 7) if min(img.pixel(x, y)[:3]) < 200)
        assert inked > 200  # a drawn page, not a blank one
        out = screenshots / "docs.png"
        out.write_bytes(shot)
        print(f"screenshot: {out}")

"""A wedge's snapshot page in a real headless Chromium: the stacks card lists each process
collapsed with its blocking frame on its own line, the engine core first; opening it shows the
lead thread's frames; the reason a worker was not read is one line; no console error."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from browser_server import ServerThread, free_port
from cdp import Browser, find_chromium

from collector.api.app import create_app
from collector.model import EventKind
from collector.storage.migrate import upgrade

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from api_context import make_context  # noqa: E402
from test_snapshots_api import make_doc, store  # noqa: E402

from tests.stacks.sample import stacks_part  # noqa: E402

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


def test_the_stacks_card_shows_each_process_collapsed_with_its_blocking_frame(tmp_path: Path, browser: Browser, screenshots: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    upgrade(url)
    ctx = make_context(url)
    doc = make_doc(kind=EventKind.ENGINE_WEDGED)
    doc.stacks = stacks_part(ts=doc.fault_ts + 0.2)
    sid, _ = store(ctx.repo, doc)
    crash, _ = store(ctx.repo, make_doc())
    with ServerThread(create_app(ctx), free_port()) as srv:
        page = browser.new_page()
        page.send("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
        page.navigate(f"{srv.url}/snapshots/{sid}")
        page.wait_js("document.body.dataset.ready === '1' || !!document.querySelector('.error')", timeout=60)
        assert page.evaluate("document.getElementById('stacks-card').hidden") is False
        procs = page.evaluate(
            "[...document.querySelectorAll('#stacks-card details.process')].map(d => ({role: d.dataset.role, open: d.open,"
            " line: d.querySelector('summary').innerText}))"
        )
        assert [p["role"] for p in procs] == ["engine_core", "worker"]
        assert not any(p["open"] for p in procs)  # collapsed
        assert "blocked at wait_for_the_engine_lock (" in procs[0]["line"]
        reasons = page.evaluate("[...document.querySelectorAll('.stacks-reason')].map(p => p.innerText)")
        assert len(reasons) == 1 and "[worker 9683]" in reasons[0]
        # opened: the lead thread (MainThread) is first and open, its frames innermost first
        page.evaluate("document.querySelector('#stacks-card details.process').open = true")
        lead = page.evaluate(
            "(() => { const t = document.querySelector('#stacks-card details.thread'); return {open: t.open, text: t.innerText}; })()"
        )
        assert lead["open"] and "MainThread" in lead["text"]
        assert lead["text"].index("wait_for_the_engine_lock") < lead["text"].index("<module>")
        assert "collective" in page.evaluate("document.getElementById('stacks-gpus').innerText")
        browser.pump(0.3)
        assert page.console_errors() == []
        (screenshots / "stacks-card.png").write_bytes(page.screenshot(full_page=True))
        # a crash's snapshot keeps its page as it was: no stacks card
        page.navigate(f"{srv.url}/snapshots/{crash}")
        page.wait_js("document.body.dataset.ready === '1' || !!document.querySelector('.error')", timeout=60)
        assert page.evaluate("document.getElementById('stacks-card').hidden") is True
        assert page.console_errors() == []

"""The snapshot page and the incident page at 8 engines x 256 running (tests/browser/scale_db.py),
judged in Chromium as a person reads them: the context plot draws percentile bands and names
the five longest requests (not 256 lines and a legend of every id), any request can be drawn on
demand, the step-timing plots are there, the host-mirror item is a summary linking the table,
what vLLM does not expose is grey, and the incident page puts every engine of both hosts on one
timeline. Screenshots land in the tests' screenshot folder (FLIGHTREC_SCREENSHOT_DIR)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import scale_db
from api_context import make_context
from browser_server import ServerThread, free_port
from cdp import Browser, find_chromium

from collector.api.app import create_app

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")]
CTX = "Context length per request (computed tokens)"


@pytest.fixture(scope="module")
def scale_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('scale') / 'scale.db'}"
    scale_db.build(url)
    return url


@pytest.fixture
def browser() -> Any:
    assert CHROMIUM is not None
    b = Browser(CHROMIUM)
    try:
        yield b
    finally:
        b.close()


def _open(browser: Browser, url: str, height: int = 1000) -> Any:
    page = browser.new_page()
    page.send("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": height, "deviceScaleFactor": 1, "mobile": False})
    page.navigate(url)
    page.wait_js("document.body.dataset.ready === '1' || !!document.querySelector('.error, #token-form')", timeout=60)
    assert page.evaluate("document.body.dataset.ready") == "1", page.evaluate("document.body.innerText.slice(0, 2000)")
    return page


def _shot(page: Any, folder: Path, name: str, height: int) -> None:
    out = folder / name
    out.write_bytes(page.screenshot(clip={"x": 0, "y": 0, "width": 1400, "height": height, "scale": 0.7}))
    print(f"screenshot: {out}")


def test_the_snapshot_page_at_256_running(scale_url: str, browser: Browser, screenshots: Path) -> None:
    with ServerThread(create_app(make_context(scale_url, host_name="node-a")), free_port()) as srv:
        page = _open(browser, f"{srv.url}/snapshots/1")
        browser.pump(0.3)
        assert page.console_errors() == []
        titles = page.evaluate("[...document.querySelectorAll('canvas[data-plot]')].map(c => [c.dataset.plot, +c.dataset.drawn])")
        drawn = dict(titles)
        for title in ("Step duration (ms)", "Tokens per step", "Scheduled prefill vs decode tokens", CTX, "Host-mirror rows per request"):
            assert drawn.get(title, 0) > 1, (title, titles)

        # bands and five names, not a legend of 256 ids
        keys = page.evaluate(
            f"[...document.querySelector('canvas[data-plot=\"{CTX}\"]').parentElement.querySelectorAll('.legend .key')].map(k => k.textContent)"
        )
        assert 5 <= len(keys) <= 12, keys
        named = [k for k in keys if k.startswith("cmpl-")]
        assert len(named) == 5
        # they are the five longest at the fault, longest first
        rows = page.evaluate("[...document.querySelectorAll('#requests tbody tr')].map(r => [...r.cells].map(c => c.textContent))")
        head = page.evaluate("[...document.querySelectorAll('#requests thead th')].map(h => h.textContent)")
        rid, ctx = head.index("request_id"), head.index("computed_tokens")
        assert len(rows) == 256
        by_ctx = sorted(rows, key=lambda r: -int(r[ctx]))
        ctx_of = {r[rid]: int(r[ctx]) for r in rows}
        shown = [(k.split(" (")[0], int(k.rsplit("(", 1)[1].rstrip(")"))) for k in named]
        assert [c for _, c in shown] == [int(r[ctx]) for r in by_ctx[:5]]  # the five longest (ties in either order)
        assert all(ctx_of[name] == c for name, c in shown)
        text = page.evaluate("document.body.innerText")
        assert "256 requests running at the fault" in text

        # one request on demand: from the list, then from a table row
        pick = by_ctx[100][rid]
        page.evaluate(f"(() => {{ const s = document.getElementById('req-pick'); s.value = {pick!r}; s.dispatchEvent(new Event('change')); }})()")
        assert page.evaluate("document.body.dataset.request") == pick
        assert "steps recorded, context" in page.evaluate("document.getElementById('req-pick-note').textContent")
        other = by_ctx[200][rid]
        page.evaluate(f"[...document.querySelectorAll('#requests tbody tr')].find(r => r.textContent.includes({other!r})).click()")
        assert page.evaluate("document.body.dataset.request") == other
        assert page.evaluate("document.getElementById('req-pick').value") == other

        # the checklist: a host-mirror summary linking the table; host imports grey, not red
        mirror = page.evaluate("document.querySelector('td[data-key=\"mirror_rows\"]').textContent")
        assert "rows over 256 requests" in mirror and "every request: the table below" in mirror and mirror.count("cmpl-") <= 5
        assert page.evaluate("document.querySelector('td[data-key=\"mirror_rows\"] a').getAttribute('href')") == "#requests-card"
        grey = page.evaluate("""(() => { const td = document.querySelector('td[data-key="import_prefix_via_host"]');
          return [td.textContent, getComputedStyle(td).color, td.closest('tr').dataset.status]; })()""")
        assert grey[0] == "not exposed by this vLLM" and grey[2] == "not_exposed" and grey[1] == "rgb(153, 153, 153)", grey
        # the checklist follows the fault: the Xid's class and what the detectors saw come first
        labels = page.evaluate("[...document.querySelectorAll('#checklist th')].map(t => t.textContent)")
        assert labels.index("GPU Xid and its class") < labels.index("KV connectors in use") < labels.index("vLLM version")
        assert "hardware" in page.evaluate("document.querySelector('td[data-key=\"xid\"]').textContent")
        assert "stall warning" in page.evaluate("document.querySelector('td[data-key=\"detectors_before\"]').textContent")
        page.evaluate("document.getElementById('req-pick').value = ''; document.getElementById('req-pick').dispatchEvent(new Event('change'))")
        _shot(page, screenshots, "snapshot-8x256.png", 2900)


def test_the_incident_page_puts_every_engine_on_one_timeline(scale_url: str, browser: Browser, screenshots: Path) -> None:
    with ServerThread(create_app(make_context(scale_url, host_name="node-a")), free_port()) as srv:
        page = _open(browser, f"{srv.url}/incidents/1")
        browser.pump(0.3)
        assert page.console_errors() == []
        text = page.evaluate("document.body.innerText")
        assert "Incident 1: xid on node-a/decode-0" in text and "2 host(s) · 8 engine(s) · 8 snapshot(s)" in text
        assert "pd-a = node-a/decode-0 + node-a/prefill-0" in text and "pd-b = node-b/decode-0 + node-b/prefill-0" in text
        lanes = page.evaluate("+document.getElementById('timeline-lanes').dataset.lanes")
        assert lanes == 10  # eight engines and each host's own witnesses
        kinds = page.evaluate("[...document.querySelectorAll('#timeline tbody tr')].map(r => r.dataset.kind)")
        assert kinds.count("xid") == 2 and kinds.count("cuda_error") == 8 and kinds.count("anomaly") == 8
        holders = page.evaluate("[...document.querySelectorAll('#timeline .gpu-holders')].map(d => d.textContent)")
        assert holders == ["GPU held by inference/decode-0 (vllm)"] * 2
        alerts = page.evaluate("[...document.querySelectorAll('#alerts tbody tr')].map(r => r.cells[1].textContent)")
        assert "GpuXidError" in alerts and "VllmEngineCrashed" in alerts
        assert page.evaluate("document.querySelectorAll('#snapshots tbody a').length") == 8
        _shot(page, screenshots, "incident-8x256.png", 1500)
        # the snapshot page links its incident
        snap = _open(browser, f"{srv.url}/snapshots/1")
        assert snap.evaluate("document.getElementById('incident-link').getAttribute('href')") == "/incidents/1"

"""The snapshot page in a real headless Chromium: it loads with no console error, its plots
are drawn (read back from the canvases and from a screenshot's pixels), its checklist and
tracebacks are there, and a token given as ?token= works when reads need one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from cdp import Browser, find_chromium
from png import decode

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")]
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img" / "snapshot-page.png"

# For each canvas: how many of its pixels are not the background, and how many distinct colours.
CANVAS_INK = """
[...document.querySelectorAll('canvas[data-plot]')].map(c => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let ink = 0; const colours = new Set();
  for (let i = 0; i < d.length; i += 4) {
    if (d[i] < 235 || d[i+1] < 235 || d[i+2] < 235) { ink++; colours.add((d[i] >> 4) + ',' + (d[i+1] >> 4) + ',' + (d[i+2] >> 4)); }
  }
  const r = c.getBoundingClientRect();
  return {title: c.dataset.plot, drawn: +c.dataset.drawn, ink, colours: colours.size, total: d.length / 4,
          x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height};
})
"""


@pytest.fixture
def browser() -> Any:
    assert CHROMIUM is not None
    b = Browser(CHROMIUM)
    try:
        yield b
    finally:
        b.close()


def _open(browser: Browser, url: str) -> Any:
    page = browser.new_page()
    page.send("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
    page.navigate(url)
    page.wait_js("document.body.dataset.ready === '1' || !!document.querySelector('.error, #token-form')", timeout=60)
    return page


def _is_red(px: tuple[int, ...]) -> bool:
    r, g, b = px[:3]
    return r > 180 and g < 80 and b < 80


def test_the_snapshot_page_draws_its_plots_with_no_console_error(serve: Any, browser: Browser) -> None:
    with serve() as srv:
        page = _open(browser, f"{srv.url}/snapshots/1")
        assert page.evaluate("document.body.dataset.ready") == "1", page.evaluate("document.body.innerText")
        browser.pump(0.5)
        assert page.console_errors() == []

        plots = page.evaluate(CANVAS_INK)
        titles = {p["title"] for p in plots}
        assert {
            "Running and waiting requests",
            "kv_cache_usage",
            "Preemptions per step",
            "Host-mirror rows (all requests)",
            "Context length per request (computed tokens)",
            "GPU utilisation (%)",
            "GPU memory used (GiB)",
            "GPU temperature (°C)",
            "GPU power (W)",
        } <= titles
        for p in plots:
            assert p["drawn"] > 1, p
            assert p["ink"] > 0.01 * p["total"] and p["colours"] >= 3, p  # axes, a line, the fault marker

        # the checklist answers from the snapshot; the tracebacks of both workers are shown
        text = page.evaluate("document.body.innerText")
        assert "Block size" in text and "FULL" in text and "128 GiB" in text
        assert "Worker_TP0" in text and "Worker_TP1" in text
        assert "hisparse/worker.py" in text and "copy_event.synchronize()" in text

        # the same plots, as the compositor drew them: a screenshot of the step plots
        box = page.evaluate(
            "(() => { const r = document.getElementById('step-plots').getBoundingClientRect();"
            " return {x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height}; })()"
        )
        shot = decode(page.screenshot(clip={"x": box["x"], "y": box["y"], "width": box["w"], "height": box["h"], "scale": 0.5}))
        step_plots = [p for p in plots if abs(p["y"] - box["y"]) < box["h"] and p["x"] >= box["x"] - 1 and p["y"] < box["y"] + box["h"]]
        assert step_plots
        for p in step_plots:
            x0, y0 = int((p["x"] - box["x"]) * 0.5), int((p["y"] - box["y"]) * 0.5)
            w, h = int(p["w"] * 0.5), int(p["h"] * 0.5)
            pixels = [shot.pixel(x, y) for y in range(y0 + 2, min(y0 + h - 2, shot.height)) for x in range(x0 + 2, min(x0 + w - 2, shot.width))]
            inked = [px for px in pixels if min(px) < 235]
            assert len(inked) > 0.01 * len(pixels), p["title"]
            assert any(_is_red(px) for px in pixels), f"{p['title']}: no fault marker"

        if os.environ.get("FLIGHTREC_SAVE_SCREENSHOT"):
            DOCS_IMG.parent.mkdir(parents=True, exist_ok=True)
            DOCS_IMG.write_bytes(page.screenshot(clip={"x": 0, "y": 0, "width": 1400, "height": 2300, "scale": 0.8}))


def test_the_list_page_links_to_the_snapshot(serve: Any, browser: Browser) -> None:
    with serve() as srv:
        page = browser.new_page()
        page.navigate(f"{srv.url}/snapshots")
        page.wait_js("document.querySelectorAll('#list tbody tr').length > 0 || !!document.querySelector('.error')")
        assert page.evaluate("document.querySelector('#list tbody a').getAttribute('href')") == "/snapshots/1"
        assert page.evaluate("document.querySelector('#list tbody a[href^=\"/incidents/\"]').getAttribute('href')") == "/incidents/1"
        browser.pump(0.3)
        assert page.console_errors() == []


def test_a_token_in_the_address_is_kept_for_the_tab_and_sent_as_bearer(serve: Any, browser: Browser) -> None:
    with serve(host="0.0.0.0", api_token="s3cret-token") as srv:  # noqa: S104  (reads need the token)
        page = _open(browser, f"{srv.url}/snapshots/1")
        assert page.evaluate("!!document.getElementById('token-form')")  # no token: asked for one
        page = _open(browser, f"{srv.url}/snapshots/1?token=s3cret-token")
        assert page.evaluate("document.body.dataset.ready") == "1"
        assert "token" not in page.evaluate("location.href")  # taken out of the address bar
        assert page.evaluate("sessionStorage.getItem('flightrec.token')") == "s3cret-token"


SHARED_AXIS = """
(() => { const cs = [...document.querySelectorAll('canvas[data-plot]')].filter(c => c._fr && !c.dataset.plot.startsWith('before: '));
  return cs.map(c => ({title: c.dataset.plot, lo: c._fr.xlo, hi: c._fr.xhi})); })()
"""


def test_one_time_axis_one_crosshair_and_the_fault_named(serve: Any, browser: Browser) -> None:
    with serve() as srv:
        page = _open(browser, f"{srv.url}/snapshots/1")
        axes = page.evaluate(SHARED_AXIS)
        titles = {a["title"] for a in axes}
        assert "kv_cache_usage" in titles and "GPU power (W)" in titles  # step and GPU plots alike
        assert len({(round(a["lo"], 6), round(a["hi"], 6)) for a in axes}) == 1, axes  # one range
        assert axes[0]["lo"] < 0 <= axes[0]["hi"]  # seconds from the fault, the fault inside

        # hover the first step plot: every plot shows the crosshair at the same time, with values
        page.evaluate("""(() => { const c = document.querySelector('canvas[data-plot="kv_cache_usage"]');
          const r = c.getBoundingClientRect();
          c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + r.width * 0.8, clientY: r.top + r.height / 2, bubbles: true})); })()""")
        marks = page.evaluate(
            "[...document.querySelectorAll('canvas[data-plot]')]"
            ".filter(c => c._fr && !c.dataset.plot.startsWith('before: ')).map(c => c.dataset.crosshair)"
        )
        assert len(set(marks)) == 1 and marks[0] not in ("", None), marks
        readout = page.evaluate("document.querySelector('[data-readout=\"kv_cache_usage\"]').textContent")
        assert readout.startswith(("-", "+")) and "kv_cache_usage" in readout, readout

        text = page.evaluate("document.body.innerText")
        # the per-request legend names the requests running at the fault
        assert "running at the fault (step" in text
        # log-derived times are marked, and the workers' errors come after the Xid
        rows = page.evaluate("[...document.querySelectorAll('#events tbody tr')].map(r => [...r.cells].map(c => c.textContent))")
        kinds = [r[1] for r in rows]
        assert "xid" in kinds and "cuda_error" in kinds
        assert kinds.index("xid") < kinds.index("cuda_error")
        assert all("s (log time, 1 s stamp)" in r[0] or "(step" in r[0] for r in rows if r[1] == "cuda_error"), rows
        # a log stamp's second is an interval from the fault, never "-0 s"
        assert not [r for r in rows if r[0].startswith(("-0 s", "+0 s", "-0 to", "-0.0 "))], rows
        # the Xid catalog's meaning and action on the page
        assert "Action:" in text and "Xid 43" in text
        # ● is "recorded", and no cell shows raw JSON
        cells = page.evaluate("[...document.querySelectorAll('#checklist td')].map(c => c.textContent)")
        assert "●" in cells and not [c for c in cells if c.lstrip().startswith(("{", "["))]
        assert "not a verdict" in text

        # the same page with the GPU samples' whole range: still one range for all
        page.evaluate("document.getElementById('range-toggle').click()")
        wide = page.evaluate(SHARED_AXIS)
        assert len({(round(a["lo"], 6), round(a["hi"], 6)) for a in wide}) == 1 and wide[0]["lo"] <= axes[0]["lo"]
        page.evaluate("document.getElementById('range-toggle').click()")
        assert page.console_errors() == []
        DOCS_IMG.parent.mkdir(parents=True, exist_ok=True)
        if os.environ.get("FLIGHTREC_SAVE_SCREENSHOT"):
            page.evaluate("""(() => { const c = document.querySelector('canvas[data-plot="Running and waiting requests"]');
              const r = c.getBoundingClientRect();
              c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + r.width * 0.75, clientY: r.top + 40, bubbles: true})); })()""")
            DOCS_IMG.write_bytes(page.screenshot(clip={"x": 0, "y": 0, "width": 1400, "height": 2300, "scale": 0.8}))


def test_an_unknown_snapshot_page_is_404_and_says_so(serve: Any, browser: Browser) -> None:
    import urllib.error
    import urllib.request

    with serve() as srv:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{srv.url}/snapshots/99", timeout=10)
        assert err.value.code == 404
        page = browser.new_page()
        page.navigate(f"{srv.url}/snapshots/99")
        assert "No snapshot 99" in page.evaluate("document.body.innerText")


def test_a_manual_snapshot_without_recorder_says_why(tmp_path: Path, browser: Browser) -> None:
    import time

    from api_context import make_context
    from browser_server import ServerThread, free_port

    from collector.api.app import create_app
    from collector.model import Event, EventKind
    from collector.snapshot.freeze import build_snapshot
    from collector.storage.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'manual.db'}"
    upgrade(url)
    ctx = make_context(url, host_name="node-a")
    now = time.time()
    trigger = Event(kind=EventKind.MANUAL, ts=now, source="api", message="manual snapshot: drill", engine="decode-0")
    doc = build_snapshot(
        host="node-a", engine="decode-0", trigger=trigger, steps=[], gpu_samples=[], events=[trigger], log_lines=[], fingerprint={}, created_at=now
    )
    sid, _ = ctx.repo.store_snapshot(doc, incident_window_s=30, incident_key="k")
    with ServerThread(create_app(ctx), free_port()) as srv:
        page = _open(browser, f"{srv.url}/snapshots/{sid}")
        body = page.evaluate("document.body.innerText")
        note = page.evaluate("document.getElementById('no-recorder') && document.getElementById('no-recorder').textContent")
        assert note, body[:2000]
        assert note.startswith("This manual snapshot of decode-0 holds no engine steps")
        assert "--scheduler-cls collector.vllm.RecordingScheduler" in note and "FLIGHTREC_ENGINE_NAME=decode-0" in note
        assert page.console_errors() == []


def test_the_summary_and_next_steps_are_in_the_first_response(serve: Any, browser: Browser) -> None:
    """Before any script runs: the fault, its GPU, the engine, model, TP size, P/D role, pair and
    vLLM version, the runbook and the report and replay commands of this snapshot are in the
    HTML the server sends; with scripts off, a browser shows them."""
    import urllib.request

    with serve() as srv:
        body = urllib.request.urlopen(f"{srv.url}/snapshots/1", timeout=30).read().decode()
        head = body[: body.index('id="fault"')]
        for fact in ("xid", "0000:00:06.0", "decode-0", "deepseek-ai/DeepSeek-V3.2-Exp", "decode (kv_consumer)", "pd-0", "Xid 43"):
            assert fact in head, fact
        assert "<dt>TP size</dt><dd>2</dd>" in head
        assert "flightrec report 1 --db " in head and "flightrec replay 1 --db " in head and "flightrec replay --plan 1" in head
        assert "GpuXidError" in head and "Action:" in head
        assert head.index('id="summary"') < head.index('id="next-steps"')

        page = browser.new_page()
        page.send("Emulation.setScriptExecutionDisabled", {"value": True})
        page.navigate(f"{srv.url}/snapshots/1")
        text = page.evaluate("document.body.innerText")
        assert "decode (kv_consumer)" in text and "flightrec report 1" in text and "Next steps" in text


def test_the_minutes_before_show_the_ramp_the_last_steps_do_not(serve: Any, browser: Browser) -> None:
    """The ring's 4,096 steps cover seconds of the demo; the strip from the stored steps covers
    the ramp before them, on its own axis, drawn."""
    with serve() as srv:
        page = _open(browser, f"{srv.url}/snapshots/1")
        page.wait_js("document.body.dataset.before !== undefined", timeout=30)
        assert int(page.evaluate("document.body.dataset.before")) > 10
        strip = [p for p in page.evaluate(CANVAS_INK) if p["title"].startswith("before: ")]
        assert len(strip) == 4
        for p in strip:
            assert p["drawn"] > 1 and p["ink"] > 0.01 * p["total"], p
        spans = page.evaluate(
            "[...document.querySelectorAll('canvas[data-plot]')].filter(c => c._fr).map(c => [c.dataset.plot, c._fr.xlo, c._fr.xhi])"
        )
        before = [lo for title, lo, _ in spans if title.startswith("before: ")]
        ring = [lo for title, lo, _ in spans if title == "kv_cache_usage"]
        assert before and ring and min(before) < ring[0] - 5  # it reaches seconds further back than the ring
        note = page.evaluate("document.getElementById('before-note').textContent")
        assert "the last steps below cover only the final" in note
        assert page.console_errors() == []


def test_a_reader_without_the_token_gets_no_server_rendered_data(serve: Any) -> None:
    import urllib.request

    with serve(host="0.0.0.0", api_token="s3cret-token") as srv:  # noqa: S104  (reads need the token)
        body = urllib.request.urlopen(f"{srv.url}/snapshots/1", timeout=30).read().decode()
        assert 'id="summary"' not in body and "DeepSeek" not in body
        body = urllib.request.urlopen(f"{srv.url}/snapshots/1?token=s3cret-token", timeout=30).read().decode()
        assert 'id="summary"' in body and "DeepSeek" in body

"""The fleet view in a real headless Chromium, served by a real ``flightrec serve --fleet`` over
the real Postgres that four nodes' sidecars wrote to: every node's crashes are listed, grouped
by signature (node-a's bad GPU as a hardware fault that follows it, the connector's CUDA error
as a software fault on two hosts), the filters narrow them, and a snapshot another node wrote
(the demo's, with its steps and plots) opens from it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cdp import Browser, find_chromium

from collector.storage.connect import make_engine
from collector.storage.migrate import upgrade
from collector.storage.repo import Repository, SnapshotFilter

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fleet.crashes import crash_doc, store  # noqa: E402

CHROMIUM = find_chromium()
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.postgres, pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")]
ROOT = Path(__file__).resolve().parents[2]
T = time.time() - 6 * 3600
HOUR = 3600.0


@pytest.fixture
def browser() -> Iterator[Browser]:
    assert CHROMIUM is not None
    b = Browser(CHROMIUM)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def fleet_server(pg_url: str, demo_run: Any, tmp_path: Path) -> Iterator[tuple[str, int]]:
    upgrade(pg_url)
    db = make_engine(pg_url)
    nodes = {h: Repository(db, host=h) for h in ("node-a", "node-b", "node-c", "node-d")}
    store(nodes["node-a"], crash_doc("node-a", "decode-0", T, xid=79, gpu="0000:18:00.0", cuda=False))
    store(nodes["node-a"], crash_doc("node-a", "decode-1", T + HOUR, xid=79, gpu="0000:18:00.0", cuda=False, model="m-2"))
    store(nodes["node-b"], crash_doc("node-b", "decode-0", T + 2 * HOUR, xid=43, gpu="0000:9a:00.0"))
    store(nodes["node-c"], crash_doc("node-c", "decode-0", T + 3 * HOUR, xid=43, gpu="0000:18:00.0"))
    demo = Repository(make_engine(demo_run.db), host="demo")
    rows, _ = demo.list_snapshots(SnapshotFilter(engine="decode-0"))
    doc = demo.get_snapshot(rows[-1]["id"])
    doc.host, doc.id, doc.incident_id = "node-d", None, None
    demo_id = store(nodes["node-d"], doc)
    db.dispose()
    out = tmp_path / "fleet.log"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}, "PYTHONPATH": str(ROOT)}
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "collector.cli", "serve", "--fleet", "--db", pg_url, "--port", "0"],
            cwd=tmp_path,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.time() + 60
        while "serving on http://" not in out.read_text(errors="replace"):
            assert proc.poll() is None and time.time() < deadline, out.read_text(errors="replace")
            time.sleep(0.1)
        url = out.read_text(errors="replace").split("serving on ", 1)[1].split()[0]
        yield url, demo_id
    finally:
        proc.terminate()
        proc.wait(30)


def rows(page: Any) -> list[dict[str, Any]]:
    return page.evaluate(  # type: ignore[no-any-return]
        "[...document.querySelectorAll('#groups tbody tr')].map(r => ({pattern: r.dataset.pattern, cells: [...r.cells].map(c => c.textContent)}))"
    )


def test_the_fleet_page_groups_every_nodes_crashes_and_opens_another_nodes_snapshot(fleet_server: tuple[str, int], browser: Browser) -> None:
    url, demo_id = fleet_server
    page = browser.new_page()
    page.send("Emulation.setDeviceMetricsOverride", {"width": 1600, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
    page.navigate(f"{url}/fleet")
    page.wait_js("document.querySelectorAll('#groups tbody tr').length > 0 || !!document.querySelector('.error')", timeout=60)
    got = rows(page)
    by = {r["pattern"]: r["cells"] for r in got}
    assert set(by) >= {"follows_gpu", "recurs_across_gpus"}
    hw, sw = by["follows_gpu"], by["recurs_across_gpus"]
    assert hw[1].startswith("hardware") and "0000:18:00.0" in hw[1] and hw[2] == "2" and hw[3] == "node-a"
    assert sw[1].startswith("software") and sw[3] == "node-b, node-c" and sw[6] == "unspecified launch failure"
    # what an occurrence is, said on the page
    assert "occurrence is one incident" in page.evaluate("document.querySelector('#occurrence-note').textContent").replace("\n", " ")
    hosts = {h for r in got for h in r["cells"][3].split(", ")}
    assert hosts == {"node-a", "node-b", "node-c", "node-d"}  # every node's crashes
    assert page.evaluate("document.querySelectorAll('#incidents tbody tr').length") >= 5
    assert page.evaluate("[...document.querySelector('select[name=host]').options].map(o => o.value)") == ["", "node-a", "node-b", "node-c", "node-d"]
    browser.pump(0.3)
    assert page.console_errors() == []

    page.navigate(f"{url}/fleet?xid=43&host=node-c")  # the filters, as the form submits them
    page.wait_js("document.querySelectorAll('#groups tbody tr').length > 0", timeout=30)
    narrowed = rows(page)
    assert [r["cells"][3] for r in narrowed] == ["node-c"] and page.evaluate("document.querySelector('select[name=xid]').value") == "43"

    page.navigate(f"{url}/fleet?host=node-d")
    page.wait_js(f"!!document.querySelector('#groups a[href=\"/snapshots/{demo_id}\"]')", timeout=30)
    href = page.evaluate(f"document.querySelector('#groups a[href=\"/snapshots/{demo_id}\"]').getAttribute('href')")
    page.navigate(f"{url}{href}")  # as the link does (a click's navigation races the next evaluate)
    page.wait_js("document.body.dataset.ready === '1' || !!document.querySelector('.error')", timeout=60)
    assert page.evaluate("location.pathname") == f"/snapshots/{demo_id}"
    assert page.evaluate("document.querySelectorAll('canvas[data-plot]').length") > 0  # its steps, plotted
    assert page.evaluate("document.body.textContent").count("node-d") >= 1
    browser.pump(0.3)
    assert page.console_errors() == []

"""VllmMetricsSource against fake vLLM peers (httpx.MockTransport) serving real captured pages."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.model import Event, EventKind, MetricsScrape, Severity
from collector.sources.base import Source, SourceError
from collector.sources.vllm_metrics import KEPT_SAMPLES, VllmMetricsSource

PAGES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-metrics"
IDLE = (PAGES / "idle.txt").read_text()
LOADED = (PAGES / "load-running-waiting.txt").read_text()
AFTER = (PAGES / "after-ramp.txt").read_text()


@dataclass
class Engine:
    name: str
    url: str


class ListSink:
    def __init__(self) -> None:
        self.items: list[object] = []

    def emit(self, item: object) -> None:
        self.items.append(item)

    def scrapes(self, engine: str | None = None) -> list[MetricsScrape]:
        return [i for i in self.items if isinstance(i, MetricsScrape) and engine in (None, i.engine)]

    def events(self) -> list[Event]:
        return [i for i in self.items if isinstance(i, Event)]


class FakeClock:
    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def reference(text: str, engine: str = "0") -> dict[str, float]:
    """Kept values of one engine as prometheus_client reads them, keyed as documented."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in KEPT_SAMPLES and s.labels.get("engine") == engine:
                extra = sorted((k, v) for k, v in s.labels.items() if k not in ("engine", "model_name"))
                selector = "{" + ",".join(f'{k}="{v}"' for k, v in extra) + "}" if extra else ""
                out[s.name.removeprefix("vllm:") + selector] = float(s.value)
    return out


def serve(pages: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(pages))


def run_for(source: VllmMetricsSource, sink: ListSink, seconds: float) -> None:
    """The source's own loop for ``seconds``, then cancelled."""

    async def go() -> None:
        task = asyncio.create_task(source.run(sink))
        await asyncio.sleep(seconds)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())


def static(metrics: str, health: int = 200) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(health)
        return httpx.Response(200, text=metrics)

    return handler


async def scrape_sequence(source: VllmMetricsSource, client: httpx.AsyncClient, sink: ListSink, mono: FakeClock, n: int, step: float = 2.0) -> None:
    for _ in range(n):
        await source.scrape_once(client, sink)
        mono.now += step


def test_is_a_source() -> None:
    assert isinstance(VllmMetricsSource(engines=[Engine("e", "http://e")]), Source)


def test_values_match_reference_and_labelled_families_are_keyed_by_label() -> None:
    sink = ListSink()
    source = VllmMetricsSource(engines=[Engine("decode-0", "http://d")])
    asyncio.run(source.scrape_once(serve(static(LOADED)), sink))
    [scrape] = sink.scrapes()
    assert scrape.engine == "decode-0"
    assert scrape.model_name and scrape.model_name in LOADED
    expected = reference(LOADED)
    assert scrape.values == expected
    reasons = re.findall(r'^vllm:num_requests_waiting_by_reason\{[^}]*reason="([^"]+)"', LOADED, re.M)
    assert reasons, "the captured page has waiting_by_reason samples"
    for reason in reasons:
        assert f'num_requests_waiting_by_reason{{reason="{reason}"}}' in scrape.values
    assert scrape.rates == {}  # no rate on the first scrape


def test_rates_between_scrapes_and_across_a_counter_reset() -> None:
    # idle -> loaded -> after the ramp -> idle again (the engine restarted: counters reset)
    pages = iter([IDLE, LOADED, AFTER, IDLE])
    current = {"page": IDLE}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(200, text=current["page"])

    mono, sink = FakeClock(), ListSink()
    source = VllmMetricsSource(engines=[Engine("d", "http://d")], monotonic=mono)

    async def go() -> None:
        client = serve(handler)
        for page in pages:
            current["page"] = page
            await source.scrape_once(client, sink)
            mono.now += 2.0

    asyncio.run(go())
    scrapes = sink.scrapes("d")
    assert len(scrapes) == 4
    idle, loaded, after = reference(IDLE), reference(LOADED), reference(AFTER)
    counters = [
        "prompt_tokens_total",
        "generation_tokens_total",
        'request_success_total{finished_reason="length"}',
        "num_preemptions_total",
        "e2e_request_latency_seconds_count",
        "e2e_request_latency_seconds_sum",
        "iteration_tokens_total_count",
    ]
    for key in counters:
        assert scrapes[1].rates[key] == pytest.approx((loaded[key] - idle[key]) / 2.0)
        assert scrapes[2].rates[key] == pytest.approx((after[key] - loaded[key]) / 2.0)
        # After the reset the rate counts from zero: all of the new value is new.
        if idle[key] < after[key]:
            assert scrapes[3].rates[key] == pytest.approx(idle[key] / 2.0)
    assert after["generation_tokens_total"] > loaded["generation_tokens_total"] > idle["generation_tokens_total"]
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert gauge not in scrapes[2].rates


DP2 = (PAGES / "dp2-load.txt").read_text()  # a real server with --data-parallel-size 2


def test_several_dp_engines_are_separate_records_named_after_the_index() -> None:
    sink = ListSink()
    mono = FakeClock()
    source = VllmMetricsSource(engines=[Engine("decode-0", "http://d")], monotonic=mono)
    asyncio.run(scrape_sequence(source, serve(static(DP2)), sink, mono, 2))
    names = [s.engine for s in sink.scrapes()]
    assert names == ["decode-0", "decode-0/dp1"] * 2
    first, second = sink.scrapes()[:2]
    expected0, expected1 = reference(DP2, "0"), reference(DP2, "1")
    assert expected0["num_requests_running"] != expected1["num_requests_running"]
    assert first.values == expected0
    assert second.values == expected1
    # Rates are per engine: the same page twice gives zero for both, not a cross-engine delta.
    assert expected0["prompt_tokens_total"] != expected1["prompt_tokens_total"]
    assert sink.scrapes()[2].rates["prompt_tokens_total"] == 0.0
    assert sink.scrapes()[3].rates["prompt_tokens_total"] == 0.0
    assert {s.name for s in source.status()} == {"vllm_metrics:decode-0"}
    assert source.status()[0].details["engines"] == ["decode-0", "decode-0/dp1"]


def failing(error: Exception | int) -> Callable[[httpx.Request], httpx.Response]:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(error, int):
            return httpx.Response(error) if request.url.path == "/health" else httpx.Response(200, text=IDLE)
        raise error

    return handler


@pytest.mark.parametrize(
    "handler, expected, page_served",
    [
        (failing(httpx.ConnectError("Connection refused")), "ConnectError", False),
        (failing(httpx.ReadTimeout("slow")), "timed out", False),
        (failing(503), "/health: HTTP 503", True),
        (static(IDLE[: len(IDLE) // 2]), "truncated", False),
        (static(IDLE.replace('vllm:num_requests_running{engine="0"', 'vllm:num_requests_running{engine="0')), "unparsable", False),
        (static("# nothing here\n"), "no vLLM samples", False),
    ],
    ids=["refused", "timeout", "health-503", "truncated", "unbalanced-quote", "empty"],
)
def test_k_failures_give_exactly_one_engine_down_then_recovery(handler, expected, page_served) -> None:
    k = 3
    mode = {"handler": static(IDLE)}
    sink, mono = ListSink(), FakeClock()
    source = VllmMetricsSource(engines=[Engine("decode-0", "http://d")], health_fail_threshold=k, monotonic=mono)
    client = serve(lambda request: mode["handler"](request))

    async def go() -> None:
        await scrape_sequence(source, client, sink, mono, 1)  # up
        mode["handler"] = handler
        await scrape_sequence(source, client, sink, mono, k - 1)
        assert sink.events() == []  # K-1 failures: nothing yet
        await scrape_sequence(source, client, sink, mono, 5)
        [down] = sink.events()
        assert (down.kind, down.severity, down.engine, down.source) == (EventKind.ENGINE_DOWN, Severity.CRITICAL, "decode-0", "scrape")
        assert expected in down.message
        status = source.status()[0]
        assert not status.up and expected in status.reason
        assert status.details["consecutive_failures"] == k + 4
        mode["handler"] = static(LOADED)
        await scrape_sequence(source, client, sink, mono, 2)

    asyncio.run(go())
    down, back = sink.events()
    assert (back.kind, back.severity, back.engine) == (EventKind.LOG, Severity.INFO, "decode-0")
    assert "back up" in back.message
    # One record from before the failures and two after; during the failures, records only
    # when /metrics itself answered (a page read while /health fails is kept).
    assert len(sink.scrapes()) == 3 + (k + 4 if page_served else 0)
    status = source.status()[0]
    assert status.up and status.reason.startswith("last scrape") and status.details["consecutive_failures"] == 0


def test_engine_down_again_after_recovery_is_reported_again() -> None:
    mode = {"ok": True}

    def handler(request: httpx.Request) -> httpx.Response:
        if not mode["ok"]:
            raise httpx.ConnectError("Connection refused")
        return static(IDLE)(request)

    sink, mono = ListSink(), FakeClock()
    source = VllmMetricsSource(engines=[Engine("p", "http://p")], health_fail_threshold=2, monotonic=mono)

    async def go() -> None:
        client = serve(handler)
        for ok in [True, False, False, False, True, False, False]:
            mode["ok"] = ok
            await source.scrape_once(client, sink)

    asyncio.run(go())
    assert [e.kind for e in sink.events()] == [EventKind.ENGINE_DOWN, EventKind.LOG, EventKind.ENGINE_DOWN]


def test_a_slow_engine_does_not_delay_another_and_its_scrapes_never_overlap() -> None:
    in_flight = {"slow": 0, "max_slow": 0}

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "slow" and request.url.path == "/metrics":
            in_flight["slow"] += 1
            in_flight["max_slow"] = max(in_flight["max_slow"], in_flight["slow"])
            try:
                await asyncio.sleep(0.25)
            finally:
                in_flight["slow"] -= 1
        return static(IDLE)(request)

    sink = ListSink()
    source = VllmMetricsSource(
        engines=[Engine("fast", "http://fast"), Engine("slow", "http://slow")],
        interval=0.02,
        timeout=5.0,
        client_factory=lambda: serve(handler),
    )

    run_for(source, sink, 0.6)
    fast, slow = len(sink.scrapes("fast")), len(sink.scrapes("slow"))
    # 0.6 s at 0.02 s: the fast engine keeps its pace (30 ticks; loosely, on 2 shared cores)
    # while the slow one, at 0.25 s a scrape, gets at most 3, one at a time, missed ticks skipped.
    # Had the slow engine held the fast one up, both would have the same 1 to 3 scrapes: twice
    # that is the line (a busy CI machine gave 9 of the 30 ticks once).
    assert fast >= 6
    assert 1 <= slow <= 3
    assert in_flight["max_slow"] == 1
    by_name = {s.name: s for s in source.status()}
    assert by_name["vllm_metrics:slow"].details["skipped_ticks"] >= 5
    assert by_name["vllm_metrics:fast"].up


def test_constructor_rejects_duplicate_names_and_bad_intervals() -> None:
    with pytest.raises(ValueError):
        VllmMetricsSource(engines=[Engine("a", "http://a"), Engine("a", "http://b")])
    with pytest.raises(ValueError):
        VllmMetricsSource(engines=[Engine("a", "http://a")], interval=0)


def test_pages_are_captured_from_a_real_vllm() -> None:
    # The tests above are only as good as their pages: make sure they show what they claim.
    assert reference(LOADED)["num_requests_running"] >= 1 and reference(LOADED)["num_requests_waiting"] >= 1
    preempted = reference((PAGES / "load-preempted.txt").read_text())
    assert preempted["num_preemptions_total"] > 0
    assert all(v == 0 for k, v in reference(IDLE).items() if "_total" in k)


def test_a_bug_in_a_scrape_stops_run_with_a_source_error_to_be_restarted() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("not an HTTP failure")

    source = VllmMetricsSource(engines=[Engine("a", "http://a")], client_factory=lambda: serve(handler))
    with pytest.raises(SourceError, match="not an HTTP failure"):
        asyncio.run(asyncio.wait_for(source.run(ListSink()), timeout=5))


def connector_page(base: str, failed: int, xfer_sum: float) -> str:
    """A real page plus connector families as vLLM 0.33 names them (not on a 0.32 CPU build)."""
    labels = 'engine="0",model_name="tiny-llama"'
    return base + (
        "# HELP vllm:hisparse_host_cache_usage_perc Host mirror usage.\n"
        "# TYPE vllm:hisparse_host_cache_usage_perc gauge\n"
        f"vllm:hisparse_host_cache_usage_perc{{{labels}}} 0.25\n"
        "# HELP vllm:nixl_num_failed_transfers Failed NIXL transfers.\n"
        "# TYPE vllm:nixl_num_failed_transfers_total counter\n"
        f"vllm:nixl_num_failed_transfers_total{{{labels}}} {failed}.0\n"
        "# HELP vllm:nixl_xfer_time_seconds NIXL transfer time.\n"
        "# TYPE vllm:nixl_xfer_time_seconds histogram\n"
        f'vllm:nixl_xfer_time_seconds_bucket{{{labels},le="0.1"}} 3.0\n'
        f'vllm:nixl_xfer_time_seconds_bucket{{{labels},le="+Inf"}} 4.0\n'
        f"vllm:nixl_xfer_time_seconds_count{{{labels}}} 4.0\n"
        f"vllm:nixl_xfer_time_seconds_sum{{{labels}}} {xfer_sum}\n"
        f"vllm:nixl_xfer_time_seconds_created{{{labels}}} 1.7e9\n"
    )


def test_connector_families_are_kept_without_buckets_and_counters_get_rates() -> None:
    pages = iter([connector_page(IDLE, 1, 0.5), connector_page(IDLE, 3, 1.5)])
    sink, mono = ListSink(), FakeClock()
    source = VllmMetricsSource(engines=[Engine("d", "http://d")], monotonic=mono)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200) if request.url.path == "/health" else httpx.Response(200, text=next(pages))

    asyncio.run(scrape_sequence(source, serve(handler), sink, mono, 2, step=2.0))
    first, second = sink.scrapes("d")
    connector = {k: v for k, v in second.values.items() if k.startswith(("hisparse_", "nixl_"))}
    assert connector == {
        "hisparse_host_cache_usage_perc": 0.25,
        "nixl_num_failed_transfers_total": 3.0,
        "nixl_xfer_time_seconds_count": 4.0,
        "nixl_xfer_time_seconds_sum": 1.5,
    }
    assert second.rates["nixl_num_failed_transfers_total"] == 1.0
    assert second.rates["nixl_xfer_time_seconds_sum"] == 0.5
    assert second.rates["nixl_xfer_time_seconds_count"] == 0.0
    assert "hisparse_host_cache_usage_perc" not in second.rates


# -- the default client: kept-alive connections in threads, against real servers ---------------


def test_default_client_scrapes_real_servers_on_one_kept_connection_each() -> None:
    from tests.sources.test_http_get import Server

    a, b = Server(body=LOADED.encode()), Server(body=IDLE.encode(), delay=0.3)
    sink = ListSink()
    source = VllmMetricsSource(engines=[Engine("a", a.url), Engine("b", b.url)], interval=0.05, timeout=2.0)

    try:
        run_for(source, sink, 0.8)
    finally:
        a.close()
        b.close()
    fast = sink.scrapes("a")
    assert fast and fast[0].values == reference(LOADED)
    # the slow server (0.3 s per GET, two GETs a scrape) holds its own thread only
    assert len(fast) >= 4 * len(sink.scrapes("b"))
    assert 1 <= len(sink.scrapes("b")) <= 2
    assert a.connections == 1 and b.connections == 1
    assert not sink.events()


def test_a_threaded_scrape_reports_the_time_its_gets_took_not_the_wait_for_the_loops_tick() -> None:
    """The loop looks for a scrape thread's result on its shared ticks (collector.ticks), up to
    0.1 s after the thread is done: the scrape's duration is what the thread measured."""
    from tests.sources.test_http_get import Server

    server = Server(body=LOADED.encode())
    calls: list[float] = []

    def mono() -> float:  # each reading 0.5 s after the last
        calls.append(0.5 * len(calls))
        return calls[-1]

    source = VllmMetricsSource(engines=[Engine("a", server.url)], interval=1.0, timeout=2.0, monotonic=mono)
    state = source._states[0]
    try:
        (metrics, health, _), took = source._fetch_blocking(state, 1000.0)
    finally:
        server.close()
    assert not isinstance(metrics, BaseException) and health is None
    assert took == 0.5  # one reading at its start, one at its end

    async def fetch_done_long_ago(st: object, ts: float) -> tuple[object, None, None]:
        state.fetched_in_s = 0.125
        await asyncio.sleep(0.05)
        return metrics, None, None

    sink = ListSink()
    asyncio.run(source._scrape(fetch_done_long_ago, state, sink))  # type: ignore[arg-type]
    assert state.last_duration_s == 0.125
    assert sink.scrapes("a")


def test_a_threaded_scrape_done_within_its_interval_keeps_the_pace() -> None:
    """At an interval the loop's result-looking tick equals (0.1 s), a scrape whose result is
    seen on the next tick is followed by the next scrape at once, not a tick later."""
    from tests.sources.test_http_get import Server

    server = Server(body=IDLE.encode())
    sink = ListSink()
    source = VllmMetricsSource(engines=[Engine("a", server.url)], interval=0.1, timeout=2.0)

    try:
        run_for(source, sink, 1.55)
    finally:
        server.close()
    # 15 ticks in 1.5 s; a scrape every other tick (the bug this guards) would give 8 at most
    assert len(sink.scrapes("a")) >= 11


def test_default_client_reports_a_refused_engine_down() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    sink = ListSink()
    source = VllmMetricsSource(engines=[Engine("gone", url)], interval=0.02, health_fail_threshold=3, start_grace_s=0.0)

    async def go() -> None:
        task = asyncio.create_task(source.run(sink))
        for _ in range(200):
            await asyncio.sleep(0.02)
            if sink.events():
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    [down] = sink.events()
    assert down.kind is EventKind.ENGINE_DOWN and down.severity is Severity.CRITICAL
    assert "ConnectionRefusedError" in down.message
    assert not sink.scrapes()


def _pausable(paused: bool | None, asked: list[str], moving: bool = False) -> Callable[[httpx.Request], httpx.Response]:
    """A loaded engine (requests running and waiting) whose counters stand still (or move), and
    whose /is_paused answers ``paused`` (None: a 404, no dev-mode routes)."""
    n = [0]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/is_paused":
            asked.append(request.url.path)
            return httpx.Response(404) if paused is None else httpx.Response(200, json={"is_paused": paused})
        n[0] += 1
        page = (
            LOADED
            if not moving
            else re.sub(r"(vllm:generation_tokens_total\{[^}]*\}) (\S+)", lambda m: f"{m.group(1)} {float(m.group(2)) + n[0]}", LOADED)
        )
        return httpx.Response(200, text=page)

    return handler


@pytest.mark.parametrize("paused", [True, False])
def test_a_loaded_engine_whose_counters_stand_still_is_asked_whether_vllm_paused_it(paused: bool) -> None:
    asked: list[str] = []
    sink, mono = ListSink(), FakeClock()
    source = VllmMetricsSource(engines=[Engine("decode-0", "http://d")], clock=FakeClock(1000.0), monotonic=mono)
    asyncio.run(scrape_sequence(source, serve(_pausable(paused, asked)), sink, mono, 3))
    got = [s.paused for s in sink.scrapes("decode-0")]
    assert got == [None, paused, paused]  # the first page has nothing to compare with
    assert asked == ["/is_paused", "/is_paused"]


def test_no_pause_endpoint_is_asked_once_and_moving_counters_never() -> None:
    asked: list[str] = []
    sink, mono = ListSink(), FakeClock()
    source = VllmMetricsSource(engines=[Engine("decode-0", "http://d")], monotonic=mono)
    asyncio.run(scrape_sequence(source, serve(_pausable(None, asked)), sink, mono, 4))
    assert asked == ["/is_paused"] and all(s.paused is None for s in sink.scrapes())
    asked.clear()
    source = VllmMetricsSource(engines=[Engine("decode-0", "http://d")], monotonic=mono)
    asyncio.run(scrape_sequence(source, serve(_pausable(True, asked, moving=True)), sink, mono, 4))
    assert asked == []  # it steps: nothing to ask


def test_an_engine_that_never_answered_is_starting_until_the_grace_ends() -> None:
    """A configured engine still loading when the sidecar starts is not down: no ENGINE_DOWN (and
    so no snapshot, no page) until ``start_grace_s`` after its first failed scrape; then one,
    saying it never answered. An engine that answered once is down after K failures at once."""

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused")

    mode = {"handler": refused}
    sink, mono, wall = ListSink(), FakeClock(), FakeClock()
    source = VllmMetricsSource(engines=[Engine("loading", "http://l")], health_fail_threshold=3, start_grace_s=600.0, monotonic=mono, clock=wall)

    async def go() -> None:
        client = serve(lambda request: mode["handler"](request))
        for _ in range(10):
            await source.scrape_once(client, sink)
            wall.now += 59.0
        assert sink.events() == []  # 531 s of failures: still starting
        assert source.status()[0].details["consecutive_failures"] == 10
        for _ in range(3):
            await source.scrape_once(client, sink)
            wall.now += 59.0
        [down] = sink.events()
        assert down.kind is EventKind.ENGINE_DOWN and down.severity is Severity.CRITICAL
        assert down.data["never_up"] is True and "never answered" in down.message

    asyncio.run(go())


def test_an_engine_that_answered_once_is_down_after_k_failures_even_within_the_grace() -> None:
    mode = {"ok": True}

    def handler(request: httpx.Request) -> httpx.Response:
        if not mode["ok"]:
            raise httpx.ConnectError("Connection refused")
        return static(IDLE)(request)

    sink, mono = ListSink(), FakeClock()
    source = VllmMetricsSource(engines=[Engine("p", "http://p")], health_fail_threshold=2, start_grace_s=600.0, monotonic=mono)

    async def go() -> None:
        client = serve(handler)
        for ok in [False, False, False, True, False, False]:
            mode["ok"] = ok
            await source.scrape_once(client, sink)

    asyncio.run(go())
    [down] = sink.events()[-1:]
    assert [e.kind for e in sink.events()] == [EventKind.ENGINE_DOWN]
    assert down.data["never_up"] is False

"""Source: vLLM's Prometheus ``/metrics`` and ``/health`` of every engine the sidecar watches.

One asyncio task per configured engine (a vLLM server) paces its scrapes, and the scrape itself
runs in a thread of the source's pool, one per engine at most, so a slow or dead server never
delays the others. Each task scrapes on a fixed grid of ``interval`` seconds; a scrape never
overlaps the previous one of the same engine: a tick that comes while a scrape is still running
(it can take up to ``timeout`` per request) is skipped and counted, not queued.

One scrape = ``GET {url}/metrics`` then ``GET {url}/health`` on the engine's one kept-alive
connection (``collector.sources.http_get``: the standard library's client, 5x cheaper per scrape
than httpx's on the loop, by ``bench/bench_scrape.py``). The page is parsed by
``collector.parsers.prom_text`` keeping only ``KEPT_SAMPLES`` and ``KEPT_PREFIXES``, and becomes
one ``MetricsScrape`` per vLLM ``engine`` label (DP engines of one server):

- name: the configured name for engine label ``"0"`` (and for a page without the label),
  ``f"{name}/dp{idx}"`` for engine label ``idx`` otherwise (``decode-0``, ``decode-0/dp1``...);
- ``values``: keyed by the sample name without ``vllm:``; the ``engine`` and ``model_name``
  labels are dropped (the first names the record, the second goes to ``model_name``); any other
  label is kept in Prometheus selector form with sorted labels:
  ``num_requests_waiting_by_reason{reason="capacity"}``;
- ``rates``: per-second rates of the counter samples (``counter`` families and the ``_sum`` /
  ``_count`` of histograms and summaries) against the previous scrape of the same engine. A
  counter that went down was reset (the engine restarted): its rate counts from zero, i.e.
  ``value / dt``. No rate on an engine's first scrape.

Failure, as data: connection refused, timeout, a non-200 answer of either endpoint, or a page
that does not parse is an error for that scrape only (the status says why; a page that did parse
is still emitted when only /health failed, since an engine going down often serves one). After
``health_fail_threshold`` failed scrapes in a row one CRITICAL ``ENGINE_DOWN`` event is emitted,
and no other until a scrape succeeds again, which emits one INFO ``LOG`` event
("engine back up") so that alerts and incidents can be closed.

Exceptions: none leave ``run``; HTTP errors are translated into ``ScrapeError`` where they enter
and become status and events.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Protocol

import httpx

from collector.model import PROGRESS_COUNTERS, Event, EventKind, MetricsScrape, Severity, SourceStatus
from collector.parsers.prom_text import (
    MetricsParseError,
    ParsedPage,
    Sample,
    Wanted,
    parse,
)
from collector.sources.base import Sink, SourceError
from collector.sources.http_get import HttpGetError, KeepAliveGet
from collector.ticks import BASE_TICK_S, next_tick, sleep_to_tick

__all__ = [
    "KEPT_PREFIXES",
    "KEPT_SAMPLES",
    "CounterRates",
    "EngineTarget",
    "ScrapeError",
    "VllmMetricsSource",
    "page_to_scrapes",
]

PREFIX = "vllm:"

# The vLLM families we keep (sample names). Gauges and counters whole; of the latency
# histograms only _sum and _count (mean and rate; the buckets are what make the page big).
# vllm:iteration_tokens_total is a histogram despite its name.
KEPT_SAMPLES: frozenset[str] = frozenset(
    PREFIX + name
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "num_requests_waiting_by_reason",
        "kv_cache_usage_perc",
        "engine_sleep_state",  # {sleep_state="awake"} 0: put to sleep (/sleep), not wedged
        "num_preemptions_total",
        "prompt_tokens_total",
        "generation_tokens_total",
        "request_success_total",
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
        "iteration_tokens_total_sum",
        "iteration_tokens_total_count",
        "e2e_request_latency_seconds_sum",
        "e2e_request_latency_seconds_count",
        "time_to_first_token_seconds_sum",
        "time_to_first_token_seconds_count",
        "inter_token_latency_seconds_sum",
        "inter_token_latency_seconds_count",
    )
)
# Connector families, kept whole when present (vLLM 0.33's sparse-attention connector and NIXL):
# every sample but histogram buckets and _created.
KEPT_PREFIXES: tuple[str, ...] = (PREFIX + "hisparse_", PREFIX + "nixl_")
WANTED = Wanted(KEPT_SAMPLES, KEPT_PREFIXES)

# Defaults; Settings carries the same keys (scrape_interval, scrape_timeout, health_fail_threshold).
DEFAULT_INTERVAL = 1.0  # seconds between scrapes of one engine
DEFAULT_TIMEOUT = 2.0  # seconds, for each of /metrics and /health
DEFAULT_HEALTH_FAIL_THRESHOLD = 3  # failed scrapes in a row before ENGINE_DOWN
# An engine that has never answered is starting, not down, for this long after the first try:
# vLLM itself gives an engine core 600 s to come up (VLLM_ENGINE_READY_TIMEOUT_S) while it loads
# weights and captures graphs. Past it, a start that never answers pages as down.
DEFAULT_START_GRACE_S = 600.0
_COUNTER_PARTS = ("_sum", "_count")
# vLLM's pause state (pause_generation, for RL weight updates: requests held, no step, by design).
# Served where /pause is, under VLLM_SERVER_DEV_MODE; a 404 elsewhere, after which it is not asked
# again. Asked only when a page shows requests held and step and token counters that did not move
# since the previous page: a paused engine looks wedged otherwise.
PAUSE_PATH = "/is_paused"


class EngineTarget(Protocol):
    """What the source needs of a configured engine (settings' engine entries fit)."""

    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str: ...


class ScrapeError(SourceError):
    """One scrape of one engine failed (HTTP error, non-200 answer, unparsable page)."""


# ----------------------------------------------------------------------------- pure part


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _key(sample: Sample) -> str:
    name = sample.name[len(PREFIX) :] if sample.name.startswith(PREFIX) else sample.name
    extra = sorted((k, v) for k, v in sample.labels.items() if k not in ("engine", "model_name"))
    if not extra:
        return name
    inner = ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in extra)
    return f"{name}{{{inner}}}"


def _engine_name(configured: str, engine_label: str) -> str:
    if engine_label == "0":
        return configured
    return f"{configured}/dp{engine_label}"


def counter_keys(page: ParsedPage) -> Callable[[str], bool]:
    """Which sample names are counters, from the page's TYPE lines (families we keep)."""

    def is_counter(sample_name: str) -> bool:
        if sample_name.endswith(_COUNTER_PARTS):
            family = sample_name.rsplit("_", 1)[0]
            if page.types.get(family) in ("histogram", "summary"):
                return True
        kind = page.types.get(sample_name)
        if kind is None and sample_name.endswith("_total"):
            kind = page.types.get(sample_name[: -len("_total")])
        return kind == "counter"

    return is_counter


def page_to_scrapes(page: ParsedPage, *, name: str, ts: float) -> tuple[list[MetricsScrape], set[str]]:
    """Group a parsed page by vLLM ``engine`` label. Returns the records and the counter keys."""
    values_of: dict[str, dict[str, float]] = {}
    model_of: dict[str, str | None] = {}
    counters: set[str] = set()
    is_counter = counter_keys(page)
    for sample in page.samples:
        # A sample without an engine label belongs to the server as a whole: the first engine.
        label = sample.labels.get("engine", "0")
        values = values_of.get(label)
        if values is None:
            values = values_of[label] = {}
            model_of[label] = None
        if model_of[label] is None:
            model_of[label] = sample.labels.get("model_name")
        # one copy of each key for every scrape held (interned): fresh ones were 60% of a held scrape
        key = sys.intern(_key(sample))
        values[key] = sample.value
        if is_counter(sample.name):
            counters.add(key)
    scrapes = [
        MetricsScrape(engine=_engine_name(name, label), ts=ts, values=values, model_name=model_of[label]) for label, values in values_of.items()
    ]
    return scrapes, counters


@dataclass(slots=True)
class CounterRates:
    """Per-second rates of counters between successive scrapes of one engine, across resets."""

    _last: dict[str, tuple[float, dict[str, float]]] = field(default_factory=dict)

    def update(self, engine: str, at: float, values: dict[str, float], counters: Iterable[str]) -> dict[str, float]:
        """Rates since the previous call for ``engine`` (monotonic ``at``); remembers this one."""
        current = {k: values[k] for k in counters if k in values}
        previous = self._last.get(engine)
        self._last[engine] = (at, current)
        if previous is None:
            return {}
        before, old = previous
        dt = at - before
        if dt <= 0:
            return {}
        rates: dict[str, float] = {}
        for key, value in current.items():
            prior = old.get(key)
            if prior is None or math.isnan(value) or math.isnan(prior):
                continue
            # A counter never goes down: lower means the engine restarted and the counter began
            # again from zero, so all of the new value was counted since the previous scrape.
            delta = value - prior if value >= prior else value
            rates[key] = delta / dt
        return rates

    def forget(self, engine: str) -> None:
        self._last.pop(engine, None)


# ----------------------------------------------------------------------------- I/O part


@dataclass(slots=True)
class _EngineState:
    name: str
    url: str
    up: bool = False  # seen up at its last scrape
    down_reported: bool = False  # ENGINE_DOWN emitted and not yet cleared
    consecutive_failures: int = 0
    errors: int = 0  # failed scrapes since start
    skipped_ticks: int = 0  # ticks skipped because the previous scrape was still running
    scrapes: int = 0
    last_ok: float | None = None
    first_try: float | None = None  # the first scrape that failed before any answered
    last_error: str = ""
    last_duration_s: float | None = None
    fetched_in_s: float | None = None  # this scrape's GETs and parse, timed in its thread
    engines_seen: set[str] = field(default_factory=set)
    progress: dict[str, tuple[float, ...]] = field(default_factory=dict)  # each page engine's step/token counters
    pause_endpoint: bool | None = None  # /is_paused answers (None: not asked yet; False: 404)


ClientFactory = Callable[[], httpx.AsyncClient]
# What one scrape's GETs gave: the page's records and counter keys, or why not; /health's
# failure, or None; /is_paused's answer, or None (not asked, or no answer).
Fetched = tuple[tuple[list[MetricsScrape], set[str]] | BaseException, BaseException | None, bool | None]
MAX_SCRAPE_THREADS = 32


class VllmMetricsSource:
    """Scrapes ``/metrics`` and ``/health`` of every engine; see the module docstring.

    By default each engine's two GETs go over its own kept-alive HTTP/1.1 connection
    (``collector.sources.http_get``, the standard library's client) in a thread of the source's
    own pool, where the page is parsed too: the loop only paces the ticks and files the
    records. ``client_factory`` instead builds one ``httpx.AsyncClient`` used on the loop (tests
    pass one around an ``httpx.MockTransport``); ``clock`` stamps records (unix seconds);
    ``monotonic`` paces ticks and measures durations and rate intervals.
    """

    name = "vllm_metrics"

    def __init__(
        self,
        *,
        engines: Sequence[EngineTarget],
        interval: float = DEFAULT_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        health_fail_threshold: int = DEFAULT_HEALTH_FAIL_THRESHOLD,
        start_grace_s: float = DEFAULT_START_GRACE_S,
        client_factory: ClientFactory | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        wanted: Wanted = WANTED,
    ) -> None:
        if interval <= 0 or timeout <= 0 or health_fail_threshold < 1:
            raise ValueError("interval and timeout must be > 0, health_fail_threshold >= 1")
        names = [engine.name for engine in engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique: {names}")
        self._states = [_EngineState(e.name, e.url.rstrip("/")) for e in engines]
        self._interval = interval
        self._timeout = timeout
        self._threshold = health_fail_threshold
        self._start_grace_s = start_grace_s
        self._client_factory = client_factory
        self._clock = clock
        self._monotonic = monotonic
        self._wanted = wanted
        self._rates = CounterRates()
        self._looks_every = min(BASE_TICK_S, interval)  # a scrape thread's result is looked for this often
        self._conns: dict[str, KeepAliveGet] = {}

    # -- public

    async def run(self, sink: Sink) -> None:
        """Scrape every engine each ``interval`` until cancelled."""
        try:
            if self._client_factory is not None:
                async with self._client_factory() as client:
                    await self._run_all(self._httpx_fetch(client), sink)
            else:
                # One thread per engine at most: a server that hangs until the timeout holds its
                # own thread only, never another engine's scrape.
                pool = ThreadPoolExecutor(max_workers=max(1, min(MAX_SCRAPE_THREADS, len(self._states))), thread_name_prefix="flightrec-scrape")
                try:
                    await self._run_all(self._thread_fetch(pool), sink)
                finally:
                    pool.shutdown(wait=False, cancel_futures=True)
                    for conn in self._conns.values():
                        conn.close()
                    self._conns.clear()
        except* Exception as group_error:
            # Failed scrapes never get here (they are status and events); only a bug does.
            first = group_error.exceptions[0]
            raise SourceError(f"{self.name}: {type(first).__name__}: {first}") from first

    async def scrape_once(self, client: httpx.AsyncClient, sink: Sink) -> None:
        """One scrape of every engine, concurrently, through ``client`` (tests and tools)."""
        fetch = self._httpx_fetch(client)
        await asyncio.gather(*(self._scrape(fetch, state, sink) for state in self._states))

    def status(self) -> list[SourceStatus]:
        """One status per configured engine: up, last error, failures, last scrape duration."""
        out = []
        for s in self._states:
            duration = "" if s.last_duration_s is None else f"; last scrape {s.last_duration_s * 1000:.1f} ms"
            reason = s.last_error if not s.up else ""
            out.append(
                SourceStatus(
                    name=f"{self.name}:{s.name}",
                    up=s.up,
                    reason=(reason + duration).lstrip("; "),
                    last_ok=s.last_ok,
                    errors=s.consecutive_failures,
                    details={
                        "url": s.url,
                        "consecutive_failures": s.consecutive_failures,
                        "errors_total": s.errors,
                        "scrapes": s.scrapes,
                        "skipped_ticks": s.skipped_ticks,
                        "last_error": s.last_error,
                        "last_duration_s": s.last_duration_s,
                        "engines": sorted(s.engines_seen),
                        "connects": self._conns[s.name].connects if s.name in self._conns else None,
                    },
                )
            )
        return out

    # -- internals

    async def _run_all(self, fetch: Callable[[_EngineState, float], Awaitable[Fetched]], sink: Sink) -> None:
        async with asyncio.TaskGroup() as group:
            for state in self._states:
                group.create_task(self._loop(fetch, state, sink), name=f"scrape {state.name}")

    async def _loop(self, fetch: Callable[[_EngineState, float], Awaitable[Fetched]], state: _EngineState, sink: Sink) -> None:
        # at once, then on the loop's shared ticks (collector.ticks): every engine's scrape at
        # the same instants, one wake of the loop for all of them and the other periodic work
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            await self._scrape(fetch, state, sink)
            late = loop.time() - next_tick(began, self._interval)  # past the tick after it began
            if 0 <= late <= self._looks_every / 2:
                continue  # its result was looked for on that tick: the next scrape now
            if late > 0:
                # it ran past one or more ticks: they are skipped rather than fired in a burst
                state.skipped_ticks += math.floor(late / self._interval) + 1
            await sleep_to_tick(self._interval)

    def _page(self, state: _EngineState, url: str, text: str, ts: float) -> tuple[list[MetricsScrape], set[str]]:
        """A page's records (pure: runs in the scrape thread or on the loop)."""
        try:
            page = parse(text, self._wanted)
        except MetricsParseError as exc:
            raise ScrapeError(f"GET {url}: unparsable page: {exc}") from exc
        scrapes, counters = page_to_scrapes(page, name=state.name, ts=ts)
        if not scrapes:
            raise ScrapeError(f"GET {url}: no vLLM samples on the page")
        return scrapes, counters

    # the default: kept-alive connections in threads

    def _thread_fetch(self, pool: ThreadPoolExecutor) -> Callable[[_EngineState, float], Awaitable[Fetched]]:
        async def fetch(state: _EngineState, ts: float) -> Fetched:
            # Looked for on the loop's shared ticks, not handed back by the thread: a thread's
            # hand-back (call_soon_threadsafe) wakes the loop once per engine and scrape; this
            # rides the wakes the recorder's poll makes anyway, at most BASE_TICK_S later.
            done = pool.submit(self._fetch_blocking, state, ts)
            try:
                while not done.done():
                    await sleep_to_tick(self._looks_every)
            except asyncio.CancelledError:
                done.cancel()  # (a fetch already running finishes in its thread, unread)
                raise
            fetched, state.fetched_in_s = done.result()
            return fetched

        return fetch

    def _fetch_blocking(self, state: _EngineState, ts: float) -> tuple[Fetched, float]:
        """One scrape's GETs and parse (in a scrape thread), and how long they took."""
        began = self._monotonic()
        fetched = self._fetch_all(state, ts)
        return fetched, self._monotonic() - began

    def _fetch_all(self, state: _EngineState, ts: float) -> Fetched:
        conn = self._conns.get(state.name)
        if conn is None:
            conn = self._conns[state.name] = KeepAliveGet(state.url)
        metrics: tuple[list[MetricsScrape], set[str]] | BaseException
        health: BaseException | None = None
        url = state.url + "/metrics"
        try:
            status, body = conn.get("/metrics", self._timeout)
            if status != 200:
                raise ScrapeError(f"GET {url}: HTTP {status}")
            metrics = self._page(state, url, body.decode("utf-8", "replace"), ts)
        except HttpGetError as exc:
            metrics = ScrapeError(str(exc))
        except ScrapeError as exc:
            metrics = exc
        try:
            status, _ = conn.get("/health", self._timeout)
            if status != 200:
                health = ScrapeError(f"GET {state.url}/health: HTTP {status}")
        except HttpGetError as exc:
            health = ScrapeError(str(exc))
        paused = None
        if not isinstance(metrics, BaseException) and _stood_still(state, metrics[0]):
            try:
                status, body = conn.get(PAUSE_PATH, self._timeout)
                paused = _pause_answer(state, status, body)
            except HttpGetError:
                paused = None
        return metrics, health, paused

    # through an httpx client on the loop

    def _httpx_fetch(self, client: httpx.AsyncClient) -> Callable[[_EngineState, float], Awaitable[Fetched]]:
        async def fetch(state: _EngineState, ts: float) -> Fetched:
            metrics, health = await asyncio.gather(
                self._metrics(client, state, ts),
                self._get(client, state.url + "/health"),
                return_exceptions=True,
            )
            paused = None
            if not isinstance(metrics, BaseException) and _stood_still(state, metrics[0]):
                try:
                    response = await client.get(state.url + PAUSE_PATH, timeout=self._timeout)
                    paused = _pause_answer(state, response.status_code, response.content)
                except httpx.HTTPError:
                    paused = None
            return metrics, health if isinstance(health, BaseException) else None, paused

        return fetch

    async def _get(self, client: httpx.AsyncClient, url: str) -> httpx.Response:
        try:
            response = await client.get(url, timeout=self._timeout)
        except httpx.TimeoutException as exc:
            raise ScrapeError(f"GET {url}: timed out after {self._timeout:g} s") from exc
        except httpx.HTTPError as exc:
            raise ScrapeError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise ScrapeError(f"GET {url}: HTTP {response.status_code}")
        return response

    async def _metrics(self, client: httpx.AsyncClient, state: _EngineState, ts: float) -> tuple[list[MetricsScrape], set[str]]:
        url = state.url + "/metrics"
        response = await self._get(client, url)
        return self._page(state, url, response.text, ts)

    async def _scrape(self, fetch: Callable[[_EngineState, float], Awaitable[Fetched]], state: _EngineState, sink: Sink) -> None:
        started = self._monotonic()
        ts = self._clock()
        state.fetched_in_s = None
        metrics, health, paused = await fetch(state, ts)
        took = state.fetched_in_s
        state.last_duration_s = self._monotonic() - started if took is None else took
        # A page read while /health fails is still evidence (an engine on its way down often
        # serves one): emit it, and count the scrape as failed.
        if not isinstance(metrics, BaseException):
            scrapes, counters = metrics
            for page_scrape in scrapes:
                rates = self._rates.update(page_scrape.engine, started, page_scrape.values, counters)
                scrape = replace(page_scrape, rates=rates, paused=paused)
                state.engines_seen.add(scrape.engine)
                sink.emit(scrape)
        errors = [r for r in (metrics, health) if isinstance(r, BaseException)]
        for error in errors:
            if not isinstance(error, ScrapeError):
                raise error  # a bug or a cancellation, not a failed scrape
        if errors:
            self._failed(state, "; ".join(str(e) for e in errors), ts, sink)
        else:
            self._succeeded(state, ts, sink)

    def _failed(self, state: _EngineState, error: str, ts: float, sink: Sink) -> None:
        state.scrapes += 1
        state.errors += 1
        state.consecutive_failures += 1
        state.last_error = error
        state.up = False
        never_up = state.last_ok is None
        if never_up:
            if state.first_try is None:
                state.first_try = ts
            if ts - state.first_try < self._start_grace_s:
                return  # never answered yet: starting (collector.ingest.state), not down
        if state.consecutive_failures >= self._threshold and not state.down_reported:
            state.down_reported = True
            if never_up:
                error = f"never answered in the {ts - (state.first_try or ts):.0f} s since the first try; last: {error}"
            sink.emit(
                Event(
                    kind=EventKind.ENGINE_DOWN,
                    ts=ts,
                    source="scrape",
                    severity=Severity.CRITICAL,
                    engine=state.name,
                    message=(f"engine {state.name} down: {state.consecutive_failures} failed scrapes in a row; last: {error}"),
                    data={
                        "url": state.url,
                        "consecutive_failures": state.consecutive_failures,
                        "last_ok": state.last_ok,
                        "never_up": never_up,
                        "error": error,
                    },
                )
            )

    def _succeeded(self, state: _EngineState, ts: float, sink: Sink) -> None:
        state.scrapes += 1
        if state.down_reported:
            state.down_reported = False
            sink.emit(
                Event(
                    kind=EventKind.LOG,
                    ts=ts,
                    source="scrape",
                    severity=Severity.INFO,
                    engine=state.name,
                    message=f"engine {state.name} back up after {state.consecutive_failures} failed scrapes",
                    data={"url": state.url, "down_since": state.last_ok},
                )
            )
        state.up = True
        state.consecutive_failures = 0
        state.last_ok = ts
        state.last_error = ""


def _stood_still(state: _EngineState, scrapes: Sequence[MetricsScrape]) -> bool:
    """Whether an engine of the page holds requests and its step and token counters did not
    move since the previous page (remembered per engine): the moment to ask /is_paused."""
    if state.pause_endpoint is False:
        return False
    still = False
    for s in scrapes:
        v = s.values
        counters = tuple(v.get(k, -1.0) for k in PROGRESS_COUNTERS)
        before = state.progress.get(s.engine)
        state.progress[s.engine] = counters
        if before == counters and v.get("num_requests_running", 0.0) + v.get("num_requests_waiting", 0.0) > 0:
            still = True
    return still


def _pause_answer(state: _EngineState, status: int, body: bytes) -> bool | None:
    """``{"is_paused": true}`` -> True; a 404 (no dev-mode routes) or an answer that is not vLLM's
    is remembered: never asked again. A failure (5xx, timeout) says nothing and is asked again."""
    if status in (404, 405):
        state.pause_endpoint = False
        return None
    if status != 200:
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    paused = answer.get("is_paused") if isinstance(answer, dict) else None
    if not isinstance(paused, bool):  # something else answers there: not vLLM's pause state
        state.pause_endpoint = False
        return None
    state.pause_endpoint = True
    return paused

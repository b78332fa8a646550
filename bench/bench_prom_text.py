"""Cost of reading one vLLM /metrics page: our parser vs prometheus_client, and a whole scrape.

    python bench/bench_prom_text.py [--repeat N] [PAGE.txt ...]

Pages default to tests/fixtures/vllm-metrics/*.txt (captured from a real vLLM). Prints, per page,
the median time of ``collector.parsers.prom_text.parse`` (the families we keep) and of
``prometheus_client.parser.text_string_to_metric_families`` (the whole page, as any consumer of
that parser pays), their ratio, and the median cost of one full scrape of one engine by
``VllmMetricsSource`` (HTTP through an in-process transport, parse, grouping, rates).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from collector.parsers.prom_text import parse
from collector.sources.vllm_metrics import WANTED, VllmMetricsSource

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-metrics"


def _median_seconds(fn, repeat: int) -> float:
    fn()  # warm caches (regex compilation, imports)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class _NullSink:
    def emit(self, item: object) -> None:
        pass


def _scrape_cost(text: str, repeat: int) -> float:
    """Median seconds of one scrape of one engine: GET /metrics + /health, parse, group, rates."""

    def handler(request: httpx.Request) -> httpx.Response:
        body = text if request.url.path == "/metrics" else ""
        return httpx.Response(200, text=body)

    class _Engine:
        name = "bench"
        url = "http://engine"

    async def main() -> float:
        source = VllmMetricsSource(engines=[_Engine()], interval=1.0)
        sink = _NullSink()
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await source.scrape_once(client, sink)
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                await source.scrape_once(client, sink)
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    pages = args.pages or sorted(FIXTURES.glob("*.txt"))
    if not pages:
        raise SystemExit(f"no pages given and none in {FIXTURES}")

    print(f"{'page':32} {'KB':>6} {'samples':>7} {'kept':>5} {'ours ms':>8} {'prom ms':>8} {'ratio':>6} {'scrape ms':>9}")
    ratios = []
    for path in pages:
        text = path.read_text()
        samples = sum(len(f.samples) for f in text_string_to_metric_families(text))
        kept = len(parse(text, WANTED).samples)
        ours = _median_seconds(lambda: parse(text, WANTED), args.repeat)
        theirs = _median_seconds(lambda: list(text_string_to_metric_families(text)), max(20, args.repeat // 10))
        scrape = _scrape_cost(text, max(20, args.repeat // 4))
        ratios.append(theirs / ours)
        print(
            f"{path.name:32} {len(text) / 1024:6.1f} {samples:7d} {kept:5d} {ours * 1e3:8.3f} "
            f"{theirs * 1e3:8.2f} {theirs / ours:6.1f} {scrape * 1e3:9.3f}"
        )
    print(f"median ratio prometheus_client / ours: {statistics.median(ratios):.1f}x (min {min(ratios):.1f}x) over {len(pages)} pages")


if __name__ == "__main__":
    main()

"""Engine-log parsing speed: lines per second through parse_line + LogEventizer + stat lines.

Replays the real fixture logs (tests/fixtures/vllm-logs) REPEAT times and prints the median
of RUNS runs. Usage: python bench/bench_engine_log.py [REPEAT] [RUNS]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from collector.parsers.crash_dump import parse_scheduler_output
from collector.parsers.throughput_line import is_throughput_line, parse_throughput_line
from collector.parsers.tracebacks import LogEventizer
from collector.parsers.vllm_log import parse_line

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-logs"


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    lines: list[str] = []
    for name in ("normal.log", "crash.log", "sigkill.log", "incident-decode.log"):
        lines += (FIXTURES / name).read_text(encoding="utf-8", errors="replace").splitlines()
    lines *= repeat
    rates = []
    events = 0
    for _ in range(runs):
        ev = LogEventizer("bench", reference_clock=lambda: 1.8e9)
        start = time.perf_counter()
        events = 0
        for raw in lines:
            line = parse_line(raw)
            if is_throughput_line(line.message):
                parse_throughput_line(line.message)
            events += len(ev.feed_line(line, 0.0))
        events += len(ev.flush())
        rates.append(len(lines) / (time.perf_counter() - start))
    print(f"lines per run: {len(lines)}, events per run: {events}")
    print(f"median lines/s: {statistics.median(rates):,.0f} (runs: {runs})")

    # One big crash dump: 4,000 running requests, as a decode engine under load prints it.
    ids = [f"'cmpl-{i:016x}-0-abcdef{i % 10}'" for i in range(4000)]
    dump = (
        "SchedulerOutput(scheduled_new_reqs=[], scheduled_cached_reqs=CachedRequestData(req_ids=["
        + ", ".join(ids)
        + "],resumed_req_ids=set(),new_token_ids_lens=[],all_token_ids_lens={},new_block_ids=["
        + ", ".join("None" for _ in ids)
        + "],num_computed_tokens=["
        + ", ".join(str(30000 + i) for i in range(4000))
        + "],num_output_tokens=["
        + ", ".join(str(i) for i in range(4000))
        + "]), num_scheduled_tokens={"
        + ", ".join(f"{i[1:-1]}: 1" for i in ids)
        + "}, total_num_scheduled_tokens=4000)"
    )
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        rows = parse_scheduler_output(dump)["requests"]
        times.append(time.perf_counter() - start)
    print(f"crash dump of {len(rows)} requests ({len(dump) / 1e6:.2f} MB): median {statistics.median(times) * 1000:.1f} ms")


if __name__ == "__main__":
    main()

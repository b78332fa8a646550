"""Internal: ``flightrec inspect-log FILE|- [--json]``: an offline post-mortem of an engine log.

FILE may be ``-`` (stdin: ``kubectl logs POD -c vllm | flightrec inspect-log -``) and may be
gzip-compressed (recognised by its magic bytes, whatever its name). A file that is not text
(NUL bytes, or mostly bytes that are not UTF-8, in its first 8 KiB) is refused as "not a
text log" with exit 2 rather than reported as a log without events.

Runs the same parsers as the live engine-log source over a file written before the
sidecar was there: events in log order (kind, time, process, message, traceback frames),
vLLM's crash dump parsed into stats and per-request rows, and the 10 s stat lines as a
series.

The year missing from vLLM's timestamps is taken from the file's modification time (the
log was last written then; for stdin, now); a stamp more than a day after it belongs to the
year before.

JSON output (``--json``), schema ``flightrec.inspect-log/1``::

    {"schema": "flightrec.inspect-log/1", "path": str, "lines": int, "reference_ts": float,
     "counts": {kind: int},
     "events": [Event.to_dict() + data.line (1-based line number)],  # crash dumps included
     "crash_dumps": [{"ts", "line", "process", "pid", "vllm_version", "config", "stats",
                      "requests": [{"request_id", "prompt_len", "num_computed_tokens",
                                    "num_output_tokens", "num_scheduled_tokens", "new"}],
                      "scheduler", "truncated", "error"}],
     "throughput": {"samples": int, "first_ts", "last_ts", "max": {key: float},
                    "last": {key: float}, "series": [{"ts": float, key: float, ...}]}}
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import IO, Any, TextIO

from collector.errors import FlightrecError
from collector.model import Event, EventKind
from collector.parsers.throughput_line import (
    ThroughputLineError,
    is_throughput_line,
    parse_throughput_line,
)
from collector.parsers.tracebacks import LogEventizer
from collector.parsers.vllm_log import parse_line

SCHEMA = "flightrec.inspect-log/1"
EXIT_OK = 0
EXIT_UNREADABLE = 2
EXIT_BROKEN_PIPE = 141
STDIN = "-"
SNIFF_BYTES = 8192
GZIP_MAGIC = b"\x1f\x8b"


class InspectLogError(FlightrecError):
    """The log cannot be read (missing, a directory, no permission, not text, bad gzip)."""


def register(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "inspect-log",
        parents=parents,
        help="offline post-mortem of an engine log",
        description="Parse an engine log written without the sidecar: events in log order, "
        "tracebacks, vLLM's crash dump as rows, the 10 s stat lines. FILE may be "
        "'-' (stdin) and may be gzip-compressed.",
    )
    p.add_argument("file", metavar="FILE", help="the engine's log, '-' for stdin, .gz read as gzip")
    p.add_argument("--json", action="store_true", help=f"print one JSON document (schema {SCHEMA})")
    p.set_defaults(func=lambda args: main(args.file, args.json))


def looks_binary(head: bytes) -> bool:
    """True for data that is not a text log: a NUL byte, or more than one byte in ten that
    does not decode as UTF-8 (a torn multi-byte character at the cut is allowed)."""
    if not head:
        return False
    if b"\x00" in head:
        return True
    text = head.decode("utf-8", "replace")
    return text.count("\ufffd") * 10 > max(len(text), 1)


def _open_log(path: str) -> tuple[IO[bytes], float, str]:
    """(binary stream of the log's text, reference time, display name); gunzipped and
    checked to be text."""
    if path == STDIN:
        raw: IO[bytes] = sys.stdin.buffer
        ref, name = time.time(), "<stdin>"
    else:
        p = Path(path)
        try:
            if p.is_dir():
                raise IsADirectoryError(f"{p} is a directory")
            ref = os.stat(p).st_mtime
            raw = open(p, "rb")  # noqa: SIM115 - the caller closes it
        except OSError as exc:
            raise InspectLogError(f"cannot read {p}: {exc.strerror or exc}") from exc
        name = str(p)
    buffered = io.BufferedReader(raw) if not isinstance(raw, io.BufferedReader) else raw  # type: ignore[type-var]
    stream: IO[bytes] = buffered
    try:
        if buffered.peek(2)[:2] == GZIP_MAGIC:
            stream = gzip.GzipFile(fileobj=buffered)  # type: ignore[assignment]
        head = stream.peek(SNIFF_BYTES)[:SNIFF_BYTES] if hasattr(stream, "peek") else b""
    except (OSError, EOFError) as exc:
        stream.close()
        raise InspectLogError(f"cannot read {name}: {exc}") from exc
    if looks_binary(head):
        stream.close()
        raise InspectLogError(f"{name} is not a text log")
    return stream, ref, name


@dataclass(slots=True)
class Report:
    path: str
    lines: int
    reference_ts: float
    events: list[Event] = field(default_factory=list)  # every event, in log order
    throughput: list[dict[str, Any]] = field(default_factory=list)  # {"ts", values...}

    @property
    def crash_dumps(self) -> list[Event]:
        return [e for e in self.events if e.kind is EventKind.CRASH_DUMP]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.events:
            out[e.kind.value] = out.get(e.kind.value, 0) + 1
        return out

    def throughput_summary(self) -> dict[str, Any]:
        series = self.throughput
        summary: dict[str, Any] = {"samples": len(series), "series": series}
        if series:
            summary["first_ts"] = series[0]["ts"]
            summary["last_ts"] = series[-1]["ts"]
            keys = sorted({k for s in series for k in s if k != "ts"})
            summary["max"] = {k: max(s[k] for s in series if k in s) for k in keys}
            summary["last"] = {k: v for k, v in series[-1].items() if k != "ts"}
        return summary

    def to_dict(self) -> dict[str, Any]:
        dumps = []
        for e in self.crash_dumps:
            dumps.append(
                {
                    "ts": e.ts,
                    "line": e.data.get("line"),
                    "process": e.process,
                    "pid": e.pid,
                    "vllm_version": e.data.get("vllm_version"),
                    "config": e.data.get("config", {}),
                    "stats": e.data.get("stats", {}),
                    "requests": e.data.get("requests", []),
                    "scheduler": e.data.get("scheduler", {}),
                    "truncated": e.data.get("truncated", False),
                    "error": e.data.get("error"),
                }
            )
        return {
            "schema": SCHEMA,
            "path": self.path,
            "lines": self.lines,
            "reference_ts": self.reference_ts,
            "counts": self.counts(),
            "events": [e.to_dict() for e in self.events],
            "crash_dumps": dumps,
            "throughput": self.throughput_summary(),
        }


def inspect_log(path: str | Path, *, reference_ts: float | None = None, tz: tzinfo | None = None) -> Report:
    """Read the whole log and return what it says. Raises InspectLogError if unreadable.
    ``path`` may be ``-`` for stdin."""
    fh, mtime, name = _open_log(str(path))
    ref = mtime if reference_ts is None else reference_ts
    eventizer = LogEventizer(None, reference_clock=lambda: ref, tz=tz)
    events: list[Event] = []
    series: list[dict[str, Any]] = []
    count = 0
    try:
        for raw in fh:  # streamed: a log may be larger than memory wants to hold
            count += 1
            line = parse_line(raw.decode("utf-8", "replace"))
            if is_throughput_line(line.message):
                try:
                    values = parse_throughput_line(line.message)
                except ThroughputLineError:
                    values = {}
                if values:
                    sample: dict[str, Any] = {"ts": eventizer.timestamp_of(line)}
                    sample.update(values)
                    series.append(sample)
            events.extend(eventizer.feed_line(line, ref))
    except (OSError, EOFError) as exc:  # a torn or corrupt gzip stream
        raise InspectLogError(f"cannot read {name} past line {count}: {exc}") from exc
    finally:
        fh.close()
    events.extend(eventizer.flush())
    # Records close when the next line of their process arrives, so events come out of
    # order; the post-mortem reads in log order.
    events.sort(key=lambda e: (e.data.get("line", 0), e.ts))
    return Report(path=name, lines=count, reference_ts=ref, events=events, throughput=series)


# -- human output ------------------------------------------------------------------------


def _time(ts: float, tz: tzinfo | None) -> str:
    value = datetime.fromtimestamp(ts, tz) if tz else datetime.fromtimestamp(ts).astimezone()
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _proc(e: Event) -> str:
    if e.process is None:
        return "-"
    return f"{e.process}[{e.pid}]" if e.pid is not None else e.process


def _table(rows: list[list[str]], out: TextIO, indent: str = "  ") -> None:
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() + "\n")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_text(report: Report, out: TextIO, *, tz: tzinfo | None = None) -> None:
    w = out.write
    w(f"Engine log {report.path}: {report.lines} lines\n")
    counts = report.counts()
    if counts:
        w("Found: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + "\n")
    else:
        w("Found no events.\n")
    w(f"Times are local; the year comes from the file's modification time ({_time(report.reference_ts, tz)}).\n")

    if report.events:
        w(f"\nEvents ({len(report.events)}, in log order)\n")
        rows = [["line", "time", "kind", "severity", "process", "message"]]
        for e in report.events:
            msg = e.message if len(e.message) <= 110 else e.message[:107] + "..."
            rows.append(
                [
                    str(e.data.get("line", "")),
                    _time(e.ts, tz),
                    e.kind.value,
                    e.severity.value,
                    _proc(e),
                    msg,
                ]
            )
        _table(rows, out)

    tracebacks = [e for e in report.events if e.frames]
    if tracebacks:
        w("\nTracebacks\n")
    for e in tracebacks:
        w(f"\n  line {e.data.get('line')} {e.kind.value} in {_proc(e)}")
        if e.data.get("lead"):
            w(f": {e.data['lead']}")
        w("\n")
        chain = None
        for frame in e.frames:
            if chain is not None and frame.get("chain") != chain:
                w("    -- then --\n")
            chain = frame.get("chain")
            func = f", in {frame['func']}" if frame.get("func") else ""
            w(f'    File "{frame["file"]}", line {frame["line"]}{func}\n')
            if frame.get("code"):
                w(f"      {frame['code']}\n")
        w(f"    {e.data.get('exception', e.message)}\n".replace("\n", "\n    ").rstrip() + "\n")

    for e in report.crash_dumps:
        _render_dump(e, out, tz)

    summary = report.throughput_summary()
    if summary["samples"]:
        w(f"\nStat lines ({summary['samples']}, {_time(summary['first_ts'], tz)} .. {_time(summary['last_ts'], tz)})\n")
        rows = [["", "running", "waiting", "kv_cache_usage", "prompt tok/s", "gen tok/s"]]
        for label, values in (("max", summary["max"]), ("last", summary["last"])):
            rows.append(
                [
                    label,
                    _fmt(values.get("num_requests_running")),
                    _fmt(values.get("num_requests_waiting")),
                    _fmt(values.get("kv_cache_usage_perc")),
                    _fmt(values.get("prompt_throughput")),
                    _fmt(values.get("generation_throughput")),
                ]
            )
        _table(rows, out)


def _render_dump(e: Event, out: TextIO, tz: tzinfo | None) -> None:
    w = out.write
    d = e.data
    version = f", vLLM {d['vllm_version']}" if d.get("vllm_version") else ""
    w(f"\nCrash dump (line {d.get('line')}, {_time(e.ts, tz)}, {_proc(e)}{version})\n")
    if d.get("error"):
        w(f"  could not read all of it: {d['error']}\n")
    if d.get("truncated"):
        w("  the dump is truncated in the log; rows below are what was printed\n")
    stats = d.get("stats") or {}
    keys = ("running", "waiting", "deferred", "kv_cache_usage", "step_counter", "current_wave")
    shown = [f"{k}={_fmt(stats[k])}" for k in keys if k in stats]
    if shown:
        w("  stats: " + " ".join(shown) + "\n")
    prefix = stats.get("prefix_cache_stats")
    if isinstance(prefix, dict) and prefix:
        w("  prefix cache: " + " ".join(f"{k}={_fmt(v)}" for k, v in prefix.items()) + "\n")
    config = d.get("config") or {}
    if config:
        w("  config: " + " ".join(f"{k}={_fmt(v)}" for k, v in config.items()) + "\n")
    sched = d.get("scheduler") or {}
    if "total_num_scheduled_tokens" in sched:
        w(f"  scheduled tokens this step: {sched['total_num_scheduled_tokens']}\n")
    requests = d.get("requests") or []
    w(f"  requests in the failing step: {len(requests)}\n")
    if requests:
        rows = [["request_id", "prompt_len", "computed", "output", "scheduled", "new"]]
        for r in requests:
            rows.append(
                [
                    str(r.get("request_id")),
                    _fmt(r.get("prompt_len")),
                    _fmt(r.get("num_computed_tokens")),
                    _fmt(r.get("num_output_tokens")),
                    _fmt(r.get("num_scheduled_tokens")),
                    _fmt(r.get("new")),
                ]
            )
        _table(rows, out, indent="    ")


def main(path: str, as_json: bool, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Entry point of ``flightrec inspect-log``: 0 on success, 2 if the file is unreadable."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        report = inspect_log(path)
    except InspectLogError as exc:
        err.write(f"flightrec inspect-log: {exc}\n")
        return EXIT_UNREADABLE
    try:
        if as_json:
            json.dump(report.to_dict(), out, indent=2, default=str)
            out.write("\n")
        else:
            render_text(report, out)
        out.flush()
    except BrokenPipeError:
        # The reader stopped early (``| head``): silent, exit 141 as a tool SIGPIPE killed.
        # stdout now points at /dev/null so the interpreter's flush at exit stays quiet.
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return EXIT_OK
